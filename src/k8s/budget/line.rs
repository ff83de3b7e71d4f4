//! First come, first served among the waiting requests of one taker (a
//! module, or the shared services) and urgency, as client-go's rate
//! limiter reserves its tokens in the order they are asked for.
//!
//! Without it, a module's waiters raced for each token and the one that
//! had just been served usually won again (it asks for its next request's
//! token first): ten workers detaching twenty attachments, two requests
//! each, went one attachment at a time, the last gone after 39 tokens
//! instead of 30. Only the head of a line asks the [`super::state`] for a
//! token; the others wait for their turn. Pure; the async side is in
//! [`super::Budget::acquire`].

use super::state::{Taker, Urgency};

/// A place in a line.
pub type Ticket = u64;

/// Every waiting request, in arrival order, with its taker and urgency.
#[derive(Debug, Default)]
pub struct Lines {
    next: Ticket,
    waiting: Vec<(Taker, Urgency, Ticket)>,
}

impl Lines {
    /// Joins the line of `taker` and `urgency` at its end.
    pub fn join(&mut self, taker: Taker, urgency: Urgency) -> Ticket {
        let ticket = self.next;
        self.next += 1;
        self.waiting.push((taker, urgency, ticket));
        ticket
    }

    /// Whether `ticket` is first in its line (it may ask for a token).
    pub fn is_head(&self, ticket: Ticket) -> bool {
        let Some(&(taker, urgency, _)) = self.waiting.iter().find(|w| w.2 == ticket) else { return false };
        self.waiting.iter().find(|w| w.0 == taker && w.1 == urgency).is_some_and(|w| w.2 == ticket)
    }

    /// Leaves the line (served or given up); says whether the line has a
    /// new head now, which may ask for a token.
    pub fn leave(&mut self, ticket: Ticket) -> bool {
        let Some(&(taker, urgency, _)) = self.waiting.iter().find(|w| w.2 == ticket) else { return false };
        let was_head = self.is_head(ticket);
        self.waiting.retain(|w| w.2 != ticket);
        was_head && self.waiting.iter().any(|w| w.0 == taker && w.1 == urgency)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const A: Taker = Taker::Account(0);
    const B: Taker = Taker::Account(1);
    const C: Urgency = Urgency::Critical;
    const D: Urgency = Urgency::Deferrable;

    #[test]
    fn each_taker_and_urgency_has_its_own_line() {
        let mut l = Lines::default();
        let (a1, a2, b1, a_event) = (l.join(A, C), l.join(A, C), l.join(B, C), l.join(A, D));
        assert!(l.is_head(a1) && !l.is_head(a2), "second in A's line");
        assert!(l.is_head(b1), "B's line is not behind A's");
        assert!(l.is_head(a_event), "A's events are a line of their own");
        assert!(!l.leave(a2), "leaving from behind lets no one ask");
        let a3 = l.join(A, C);
        assert!(l.leave(a1), "the head left: a3 may ask");
        assert!(l.is_head(a3));
        assert!(!l.is_head(a1) && !l.leave(a1), "a ticket that left is nowhere");
        assert!(!l.leave(a3), "the last of its line: no one to tell");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Join(usize, bool),
        Leave(usize),
    }

    proptest! {
        /// Against a model (a list per line): exactly the earliest ticket
        /// still waiting in each line is its head.
        #[test]
        fn the_head_is_the_earliest_ticket_still_waiting(
            ops in proptest::collection::vec(prop_oneof![
                (0..3usize, any::<bool>()).prop_map(|(t, c)| Op::Join(t, c)),
                (0..64usize).prop_map(Op::Leave),
            ], 0..80)
        ) {
            let mut lines = Lines::default();
            let mut model: Vec<Vec<Ticket>> = vec![Vec::new(); 6];
            let mut tickets: Vec<(usize, Ticket)> = Vec::new();
            for op in ops {
                match op {
                    Op::Join(t, critical) => {
                        let taker = if t == 2 { Taker::Shared } else { Taker::Account(t) };
                        let urgency = if critical { C } else { D };
                        let line = t * 2 + usize::from(critical);
                        let ticket = lines.join(taker, urgency);
                        model[line].push(ticket);
                        tickets.push((line, ticket));
                    }
                    Op::Leave(i) => {
                        let Some(&(line, ticket)) = tickets.get(i % tickets.len().max(1)) else { continue };
                        let was_head = model[line].first() == Some(&ticket);
                        model[line].retain(|&t| t != ticket);
                        prop_assert_eq!(lines.leave(ticket), was_head && !model[line].is_empty());
                    }
                }
                for &(line, ticket) in &tickets {
                    prop_assert_eq!(lines.is_head(ticket), model[line].first() == Some(&ticket), "ticket {}", ticket);
                }
            }
        }
    }
}
