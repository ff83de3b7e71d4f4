//! The configuration vocabulary every layer shares: Go flag syntax and Go
//! values ([`goflags`]) and the flags of the shared services
//! ([`shared::SharedFlags`]).
//!
//! It sits below both `cli` (which segments argv by module and needs the
//! module table) and the modules (whose flag structs use these parsers), and
//! imports neither, so the import graph has no cycle through them.

pub mod gates;
pub mod goflags;
pub mod shared;

pub use shared::SharedFlags;
