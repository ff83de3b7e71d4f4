//! What a probe result means for `/healthz` (upstream livenessprobe's codes
//! and bodies).

use tonic::Status;

use crate::{compat, csi::proto::csi::v1::ProbeResponse, healthz::HealthReport};

/// Maps a `Probe` outcome to the HTTP answer.
pub fn report(result: Result<ProbeResponse, Status>) -> HealthReport {
    match result {
        // `ready` absent means ready (CSI spec).
        Ok(resp) if resp.ready == Some(false) => HealthReport::failed(500, compat::prober::BODY_NOT_READY),
        Ok(_) => HealthReport::ok(),
        Err(status) => HealthReport::failed(500, compat::grpc_error_text(&status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes() {
        let table: Vec<(Result<ProbeResponse, Status>, u16, &str)> = vec![
            (Ok(ProbeResponse { ready: Some(true) }), 200, "ok"),
            (Ok(ProbeResponse { ready: None }), 200, "ok"),
            (Ok(ProbeResponse { ready: Some(false) }), 500, "driver responded but is not ready"),
            (
                Err(Status::deadline_exceeded("context deadline exceeded")),
                500,
                "rpc error: code = DeadlineExceeded desc = context deadline exceeded",
            ),
            (
                Err(Status::unavailable("connection refused")),
                500,
                "rpc error: code = Unavailable desc = connection refused",
            ),
            (Err(Status::internal("boom")), 500, "rpc error: code = Internal desc = boom"),
        ];
        for (input, status, body) in table {
            let r = report(input);
            assert_eq!((r.status, r.body.as_str()), (status, body));
        }
    }
}
