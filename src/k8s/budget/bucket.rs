//! A plain token bucket (the events recorder's per-object spam filter), and
//! the refill rule every bucket of the budget shares.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// A token bucket: `qps` tokens per second, at most `burst` saved up.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket { qps, burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Takes a token now, or says how long until one is there.
    pub fn try_take(&self, now: Instant) -> Result<(), Duration> {
        let mut s = self.state.lock();
        let (tokens, last) = *s;
        let mut tokens = refill(tokens, now.saturating_duration_since(last), self.qps, self.burst);
        let taken = take(&mut tokens, self.qps);
        *s = (tokens, now);
        taken
    }
}

/// The tokens of a bucket after `elapsed` at `qps`, capped at `burst`.
pub(super) fn refill(tokens: f64, elapsed: Duration, qps: f64, burst: f64) -> f64 {
    (tokens + elapsed.as_secs_f64() * qps).min(burst)
}

/// Takes one of `tokens`, or says how long until one is there at `qps`.
fn take(tokens: &mut f64, qps: f64) -> Result<(), Duration> {
    if *tokens >= 1.0 {
        *tokens -= 1.0;
        Ok(())
    } else {
        Err(Duration::from_secs_f64((1.0 - *tokens) / qps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_qps() {
        let b = TokenBucket::new(5.0, 10);
        let t0 = Instant::now();
        for i in 0..10 {
            assert_eq!(b.try_take(t0), Ok(()), "burst token {i}");
        }
        let wait = b.try_take(t0).expect_err("bucket empty");
        assert!((wait.as_secs_f64() - 0.2).abs() < 0.01, "{wait:?}");
        assert_eq!(b.try_take(t0 + Duration::from_millis(200)), Ok(()));
        // Refill never exceeds the burst.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..10 {
            assert_eq!(b.try_take(later), Ok(()));
        }
        assert!(b.try_take(later).is_err());
    }
}
