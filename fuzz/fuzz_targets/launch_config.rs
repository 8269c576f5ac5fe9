//! The launch configuration parsers: the Runtime's (`RuntimeConfig::parse`) and Core's
//! (`CoreConfig::parse`).
//!
//! Beyond "never panics": both accept only strict JSON, and what they accept holds the
//! bounds they promise (timers within their ceiling, the reconnect backoff ordered,
//! limits within their ceiling, agent kinds bounded and unique, the event bound in
//! range).
#![no_main]

use std::collections::HashSet;
use std::time::Duration;

use contract_impl::core_runtime::daemon::RuntimeConfig;
use contract_impl::core_runtime::daemon::config::{LIMIT_CEILING, TIMER_CEILING_MS};
use contract_impl::core_runtime::gateway::CoreConfig;
use contract_impl::wire::parse_strict;
use libfuzzer_sys::fuzz_target;

fn timer_ok(d: Duration) -> bool {
    d >= Duration::from_millis(1) && d <= Duration::from_millis(TIMER_CEILING_MS)
}

fn limit_ok(n: usize) -> bool {
    (1..=LIMIT_CEILING).contains(&n)
}

fuzz_target!(|data: &[u8]| {
    let strict = parse_strict(data).is_ok();
    match RuntimeConfig::parse(data) {
        Ok(config) => {
            assert!(
                strict,
                "the Runtime accepted a configuration that is not strict JSON"
            );
            let t = &config.timers;
            for d in [
                t.admission_expiry,
                t.native_write,
                t.receipt_send,
                t.cancel_settle,
                t.reconnect_initial,
                t.reconnect_max,
                t.reconnect_healthy,
                t.cleanup_retry,
                t.write_transfer_expiry,
            ] {
                assert!(timer_ok(d), "timer {d:?} out of range");
            }
            assert!(t.reconnect_initial <= t.reconnect_max);
            let l = &config.limits;
            for n in [
                l.admission_records,
                l.active_preparations,
                l.active_executions,
                l.idle_executors,
            ] {
                assert!(limit_ok(n), "limit {n} out of range");
            }
            let kinds: HashSet<_> = config.agent_kinds.iter().map(|k| &k.agent_kind).collect();
            assert_eq!(
                kinds.len(),
                config.agent_kinds.len(),
                "an agent kind registered twice"
            );
        }
        Err(err) => {
            assert!(!err.code().is_empty());
            let _ = err.to_string();
        }
    }
    match CoreConfig::parse(data) {
        Ok(config) => {
            assert!(
                strict,
                "Core accepted a configuration that is not strict JSON"
            );
            let t = &config.timers;
            for d in [
                t.written_receipt,
                t.cancel_confirm,
                t.heartbeat_interval,
                t.preparation_retry,
                t.credential_recheck,
            ] {
                assert!(timer_ok(d), "timer {d:?} out of range");
            }
            if let Some(n) = config.events_per_turn {
                assert!(n >= 1);
            }
        }
        Err(err) => {
            assert!(!err.code().is_empty());
            let _ = err.to_string();
        }
    }
});
