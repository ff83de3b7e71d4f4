//! The shared Kubernetes runtime: one client per process (with its own
//! request budget), one informer cache, work queues, events, leader election.
//! Controller modules use these; none of them opens its own watch.

pub mod client;
pub mod events;
pub mod informers;
pub mod leader;
pub mod quantity;
pub mod queue;
