//! The `native:` step, written once for every family whose target has a control channel
//! ([`crate::transport::control`]): substitute the arguments, send the request, wait for
//! its result, match it against `expect:` (a `$reference` mismatch names its
//! requirement, so vendor mode reports it as a difference).

use std::time::Duration;

use serde_json::Value;

use super::{FailureCode, Run, StepError, StepResult, fail, show};
use crate::matcher::match_frame;
use crate::transport::control::ControlChannel;

/// Runs `native: {op: args}` on `control`. The request may wait `run.step_timeout`, or
/// longer when its own `timeout_ms` (plus `grace`) asks for more; without a
/// `timeout_ms` the target's own default applies (`default_wait`).
///
/// # Errors
/// No channel, a failed request ([`FailureCode::ControlFailed`]), a result that does not
/// match.
pub async fn native_step(
    control: Option<&mut ControlChannel>,
    run: &mut Run,
    op: &str,
    args: &Value,
    expect: Option<&Value>,
    default_wait: Duration,
    grace: Duration,
) -> StepResult {
    let args = run
        .bindings
        .substitute(args, true)
        .map_err(|e| fail::bind(e, "the control request"))?;
    let args = crate::matcher::expand_text(&args).map_err(fail::scenario)?;
    let target_wait = args
        .get("timeout_ms")
        .and_then(Value::as_u64)
        .map_or(default_wait, Duration::from_millis);
    let wait = run.step_timeout.max(target_wait + grace);
    let control = control.ok_or_else(|| {
        StepError::new(
            FailureCode::ControlFailed,
            "the target has no control channel (it exited before it was ready)",
        )
    })?;
    run.log_wire(
        "to target",
        "control request",
        &serde_json::json!({"op": op, "args": args}),
    );
    let result = control
        .request(op, &args, wait)
        .await
        .map_err(|e| StepError::new(FailureCode::ControlFailed, format!("{e} ({})", e.code())))?;
    run.log_wire(
        "from target",
        "control result",
        &serde_json::json!({"op": op, "result": result}),
    );
    // The control channel is one of the target's outputs: the secret may not appear there.
    if !run.secret.is_empty() && crate::target::contains_secret(&result.to_string(), &run.secret) {
        return Err(fail::leak(format!(
            "credential leaked in the result of control op `{op}`"
        )));
    }
    if let Some(pattern) = expect {
        match_frame(pattern, &result, &mut run.bindings).map_err(|m| {
            let e = fail::mismatch(format!(
                "result of `{op}` does not match: {m}\n  result: {}",
                show(&result)
            ));
            match &m.reference {
                Some(requirement) => e.in_reference(requirement),
                None => e,
            }
        })?;
    }
    Ok(())
}
