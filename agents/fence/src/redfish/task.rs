//! Following a task monitor: a BMC that answers a reset with 202 Accepted runs it as a Task,
//! and its monitor answers 202 until the task is done.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::session::Session;
use super::transport::{Http, Reply};
use crate::error::FenceError;

/// Pause between monitor reads when the BMC gives no `Retry-After`.
const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);
/// Bounds on the pause a BMC's `Retry-After` may ask for.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const MAX_INTERVAL: Duration = Duration::from_secs(2);

/// What a Task body says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TaskOutcome {
    /// Still running.
    Running,
    /// Completed without a critical status.
    Completed,
    /// Failed: the messages the task carries.
    Failed(String),
}

/// Reads a Task resource (or any body the monitor returns when done).
pub(crate) fn task_outcome(v: &Value) -> TaskOutcome {
    let state = v.get("TaskState").and_then(Value::as_str);
    let messages = || {
        let ms: Vec<&str> = v
            .get("Messages")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|m| m.get("Message").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default();
        format!(
            "task {} ({}){}",
            state.unwrap_or("?"),
            v.get("TaskStatus").and_then(Value::as_str).unwrap_or("?"),
            if ms.is_empty() {
                String::new()
            } else {
                format!(": {}", ms.join("; "))
            }
        )
    };
    match state {
        Some("New" | "Starting" | "Running" | "Pending" | "Stopping" | "Suspended" | "Service") => {
            TaskOutcome::Running
        }
        Some("Exception" | "Killed" | "Cancelled" | "Interrupted") => {
            TaskOutcome::Failed(messages())
        }
        _ if v.get("TaskStatus").and_then(Value::as_str) == Some("Critical") => {
            TaskOutcome::Failed(messages())
        }
        _ => TaskOutcome::Completed,
    }
}

fn retry_after(r: &Reply) -> Duration {
    r.header("retry-after")
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_INTERVAL)
        .clamp(MIN_INTERVAL, MAX_INTERVAL)
}

/// Follows the task monitor of a 202 answer until the task is done or `deadline` passes.
///
/// A monitor that disappears (404/410) once the task is done is taken as done: the power state
/// read that follows is the proof, not the task.
pub(crate) async fn follow(
    http: &Http,
    session: &Session,
    accepted: &Reply,
    deadline: tokio::time::Instant,
) -> Result<(), FenceError> {
    let device = http.device().to_string();
    let body = accepted
        .json(&device, "202 answer to the reset")
        .unwrap_or(Value::Null);
    let monitor = accepted.header("location").map(str::to_string).or_else(|| {
        body.get("@odata.id")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    let Some(monitor) = monitor else {
        tracing::info!(device = %device, "reset accepted (202) without a task monitor; verifying by power state");
        return Ok(());
    };
    let started = tokio::time::Instant::now();
    let mut wait = retry_after(accepted);
    // The BMC paces the reads with `Retry-After`; a read that fails backs off on its own.
    let mut read_errors = {
        use backon::BackoffBuilder as _;
        backon::ExponentialBuilder::new()
            .with_min_delay(DEFAULT_INTERVAL)
            .with_max_delay(MAX_INTERVAL)
            .without_max_times()
            .build()
    };
    loop {
        if tokio::time::Instant::now() + wait >= deadline {
            return Err(FenceError::Timeout {
                device,
                operation: format!("reset task {monitor}"),
                after: started.elapsed(),
            });
        }
        tokio::time::sleep(wait).await;
        let r = match http.send(Method::GET, &monitor, session.auth(), None).await {
            Ok(r) => r,
            Err(e) if e.is_retryable() => {
                tracing::debug!(device = %device, error = %e, "task monitor read failed");
                wait = read_errors.next().unwrap_or(MAX_INTERVAL);
                continue;
            }
            Err(e) => return Err(e),
        };
        wait = retry_after(&r);
        match r.status {
            StatusCode::ACCEPTED => continue,
            StatusCode::NOT_FOUND | StatusCode::GONE => return Ok(()),
            s if s.is_success() => {
                let v = r.json(&device, "task monitor").unwrap_or(Value::Null);
                match task_outcome(&v) {
                    TaskOutcome::Running => continue,
                    TaskOutcome::Completed => return Ok(()),
                    TaskOutcome::Failed(detail) => {
                        return Err(FenceError::DeviceRefused {
                            device,
                            detail: format!("reset {detail}"),
                        })
                    }
                }
            }
            _ => {
                return Err(http
                    .check(&format!("GET {monitor} (task monitor)"), r)
                    .expect_err("not a success"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn task_bodies_say_running_done_or_failed() {
        assert_eq!(
            task_outcome(&json!({"TaskState": "Running"})),
            TaskOutcome::Running
        );
        assert_eq!(
            task_outcome(&json!({"TaskState": "Completed", "TaskStatus": "OK"})),
            TaskOutcome::Completed
        );
        assert_eq!(task_outcome(&Value::Null), TaskOutcome::Completed);
        assert_eq!(
            task_outcome(&json!({"TaskState": "Exception", "TaskStatus": "Critical",
                "Messages": [{"Message": "Power supply fault"}]})),
            TaskOutcome::Failed("task Exception (Critical): Power supply fault".into())
        );
        assert!(matches!(
            task_outcome(&json!({"TaskState": "Completed", "TaskStatus": "Critical"})),
            TaskOutcome::Failed(_)
        ));
    }
}
