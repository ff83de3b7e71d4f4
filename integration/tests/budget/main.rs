//! The budget world: request rates as the apiserver sees them, run with
//! nothing beside it (run-tests.py's ALONE).
//!
//! One binary per world; integration/scripts/run-tests.py runs each module in
//! a process of its own (`<binary> --exact <its tests>`).

mod budget;
