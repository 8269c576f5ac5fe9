//! One foreground operation of a generation ("Message vocabulary"): a cell (`execute`,
//! its host requests, `interrupt`, its `completed`) or a hook call (`invoke`). The
//! connection, the handshake and the hard stop are [`super`]'s.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinSet;

use super::{CellRecord, HostError, RequestHandler, Worker};
use crate::worker::wire::limits::REQUESTS_PER_CELL_MAX;
use crate::worker::wire::{CellStatus, Completion, HostRequest, Identifier, Message, Reply, Slot};

impl Worker {
    /// Runs one cell: `execute`, the cell's host requests through `handler` (at most
    /// [`REQUESTS_PER_CELL_MAX`]; the next ones answered `request_limit`), until its
    /// `completed`. A refused frame, a frame of another operation, the end of the
    /// stream or the cell bound invalidates the generation: the worker is stopped and
    /// the record is the host's own (`observed_by_host`).
    ///
    /// # Errors
    /// [`HostError::Invalidated`] when the generation was invalidated before; a send
    /// failure.
    pub async fn execute(
        &mut self,
        code: &str,
        handler: &mut (dyn RequestHandler + Send),
    ) -> Result<CellRecord, HostError> {
        self.execute_as(None, code, handler).await
    }

    /// [`Worker::execute`] under operation ID `id`, the execution's identity the caller
    /// keeps (an execution the host runs again after a restart keeps it, so a retried
    /// request of it is the same request); `None`: this generation's next
    /// `<cell_prefix><n>`.
    ///
    /// # Errors
    /// As [`Worker::execute`].
    pub async fn execute_as(
        &mut self,
        id: Option<Identifier>,
        code: &str,
        handler: &mut (dyn RequestHandler + Send),
    ) -> Result<CellRecord, HostError> {
        if !self.is_valid() {
            return Err(HostError::Invalidated);
        }
        let id = match id {
            Some(id) => id,
            None => {
                self.next_op += 1;
                Identifier::new(format!(
                    "{}{}",
                    self.config.choices.cell_prefix, self.next_op
                ))
                .expect("a valid identifier")
            }
        };
        self.interrupts.begin(&id);
        let record = self.run_cell(id.clone(), code, handler).await;
        self.interrupts.end();
        Ok(record)
    }

    /// The cell's exchange; every failure (a refused frame, a send that does not go
    /// through within its bound, the end of the stream) is the host's own record.
    async fn run_cell(
        &mut self,
        id: Identifier,
        code: &str,
        handler: &mut (dyn RequestHandler + Send),
    ) -> CellRecord {
        if let Err(e) = self
            .send(Message::Execute {
                id: id.clone(),
                code: code.to_string(),
            })
            .await
        {
            return self.lost(&id, &e).await;
        }
        let mut requests = 0usize;
        // Requests answered beside the exchange (`RequestHandler::start`), with the
        // identity each reply repeats. Dropped when the cell ends, which abandons them:
        // "that scope expires when the foreground cell ends".
        let mut pending: JoinSet<Reply> = JoinSet::new();
        let mut pending_ids: HashMap<tokio::task::Id, (Identifier, Identifier)> = HashMap::new();
        let mut interrupted_at: Option<tokio::time::Instant> = None;
        // "A worker cannot claim a committed yield without the host having accepted the
        // wait."
        let mut wait_accepted = false;
        let deadline = self
            .config
            .cell_timeout
            .map(|t| tokio::time::Instant::now() + t);
        loop {
            let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
            let bound = match (deadline, interrupted_at) {
                (Some(a), Some(b)) => a.min(b + self.config.interrupt_grace),
                (Some(a), None) => a,
                (None, Some(b)) => b + self.config.interrupt_grace,
                (None, None) => far,
            };
            let interrupts = self.interrupts.clone();
            let next = tokio::select! {
                Some(done) = pending.join_next_with_id(), if !pending.is_empty() => {
                    let (task, reply) = match done {
                        Ok((task, reply)) => (task, reply),
                        Err(e) => (e.id(), Reply::Error {
                            code: "request_failed".into(),
                            message: format!("the request's reply failed: {e}"),
                        }),
                    };
                    let Some((request_id, execution_id)) = pending_ids.remove(&task) else {
                        continue;
                    };
                    let sent = self
                        .send(Message::HostReply { id: request_id, execution_id, reply })
                        .await;
                    if let Err(e) = sent {
                        return self.lost(&id, &e).await;
                    }
                    continue;
                }
                next = tokio::time::timeout_at(bound, self.read_message()) => match next {
                    Ok(next) => next,
                    Err(_) if interrupted_at.is_some() && deadline.is_none_or(|d| d > bound) => {
                        // "Rust retains the final hard-stop authority when code blocks or
                        // catches cancellation."
                        let mut record = self.lost(&id, &HostError::Timeout(self.config.interrupt_grace)).await;
                        record.status = self
                            .config
                            .choices
                            .interrupted_record
                            .then_some(CellStatus::Interrupted);
                        return record;
                    }
                    Err(_) => Err(HostError::Timeout(
                        self.config.cell_timeout.unwrap_or_default(),
                    )),
                },
                () = interrupts.requested(), if interrupted_at.is_none() => {
                    interrupted_at = Some(tokio::time::Instant::now());
                    if let Err(e) = self.send(Message::Interrupt { id: id.clone() }).await {
                        return self.lost(&id, &e).await;
                    }
                    continue;
                }
            };
            let message = match next {
                Ok(message) => message,
                Err(e) => return self.lost(&id, &e).await,
            };
            match message {
                Message::HostRequest {
                    id: request_id,
                    execution_id,
                    request,
                } if execution_id == id => {
                    requests += 1;
                    let reply = if wait_accepted {
                        // "The host also rejects further requests from a yielded
                        // execution": an accepted wait ends the execution's authority.
                        Reply::Error {
                            code: self.config.choices.no_scope.into(),
                            message: "the execution yielded to an accepted wait".into(),
                        }
                    } else if requests > REQUESTS_PER_CELL_MAX {
                        Reply::Error {
                            code: self.config.choices.request_limit.into(),
                            message: format!(
                                "at most {REQUESTS_PER_CELL_MAX} requests per foreground cell"
                            ),
                        }
                    } else if let Some(reply) = handler.start(&execution_id, &request_id, &request)
                    {
                        let task = pending.spawn(reply);
                        pending_ids.insert(task.id(), (request_id, execution_id));
                        continue;
                    } else {
                        handler.handle(&execution_id, &request_id, &request).await
                    };
                    if matches!(request, HostRequest::RuntimeWait { .. })
                        && matches!(reply, Reply::Ok { .. })
                    {
                        wait_accepted = true;
                    }
                    let sent = self
                        .send(Message::HostReply {
                            id: request_id,
                            execution_id,
                            reply,
                        })
                        .await;
                    if let Err(e) = sent {
                        return self.lost(&id, &e).await;
                    }
                }
                Message::Completed {
                    id: done,
                    result:
                        Completion::Cell {
                            status: CellStatus::Yielded,
                            ..
                        },
                } if done == id && !wait_accepted => {
                    let e = HostError::Protocol(
                        "the cell claims a yield the host did not accept".into(),
                    );
                    return self.lost(&id, &e).await;
                }
                Message::Completed { id: done, result } if done == id => {
                    return match result {
                        Completion::Cell {
                            status,
                            output,
                            truncated_bytes,
                            error,
                        } => CellRecord {
                            id,
                            status: Some(status),
                            output,
                            truncated_bytes,
                            error: error.0,
                            observed_by_host: false,
                        },
                        Completion::Failed { error } => CellRecord {
                            id,
                            status: None,
                            output: Vec::new(),
                            truncated_bytes: 0,
                            error: Some(error),
                            observed_by_host: false,
                        },
                        Completion::Hook { .. } => {
                            let e = HostError::Protocol("a hook completion for a cell".into());
                            self.lost(&id, &e).await
                        }
                    };
                }
                // "Host effects require the current live execution": a request of another
                // execution (a finished cell's background task) is refused, not served.
                Message::HostRequest {
                    id: request_id,
                    execution_id,
                    ..
                } => {
                    let sent = self
                        .send(Message::HostReply {
                            id: request_id,
                            execution_id,
                            reply: Reply::Error {
                                code: self.config.choices.no_scope.into(),
                                message: "the execution is not the current live one".into(),
                            },
                        })
                        .await;
                    if let Err(e) = sent {
                        return self.lost(&id, &e).await;
                    }
                }
                other => {
                    let e = HostError::Protocol(format!("{} for another operation", other.kind()));
                    return self.lost(&id, &e).await;
                }
            }
        }
    }

    /// Calls hook `slot` with `input` and returns the worker's completion (`hook` or
    /// `failed`). A host request during the call is refused `no_scope` ("No host-effect
    /// scope is given to a hook"). The caller bounds the call (the two-second budget) and
    /// invalidates the generation when it runs out ([`Worker::hard_stop`]).
    ///
    /// # Errors
    /// [`HostError::Invalidated`] before the call; any refused frame, frame of another
    /// operation or end of stream (the generation is then stopped).
    pub async fn invoke(&mut self, slot: Slot, input: Value) -> Result<Completion, HostError> {
        if !self.is_valid() {
            return Err(HostError::Invalidated);
        }
        self.next_op += 1;
        let id = Identifier::new(format!(
            "{}{}",
            self.config.choices.hook_prefix, self.next_op
        ))
        .expect("a valid identifier");
        self.send(Message::Invoke {
            id: id.clone(),
            slot,
            input,
        })
        .await?;
        loop {
            let message = match self.read_message().await {
                Ok(message) => message,
                Err(e) => {
                    self.hard_stop().await;
                    return Err(e);
                }
            };
            match message {
                Message::HostRequest {
                    id: request_id,
                    execution_id,
                    ..
                } if execution_id == id => {
                    self.send(Message::HostReply {
                        id: request_id,
                        execution_id,
                        reply: Reply::Error {
                            code: self.config.choices.no_scope.into(),
                            message: "a hook has no host-effect scope".into(),
                        },
                    })
                    .await?;
                }
                Message::Completed { id: done, result } if done == id => match result {
                    Completion::Cell { .. } => {
                        self.hard_stop().await;
                        return Err(HostError::Protocol("a cell completion for a hook".into()));
                    }
                    other => return Ok(other),
                },
                other => {
                    self.hard_stop().await;
                    return Err(HostError::Protocol(format!(
                        "{} for another operation",
                        other.kind()
                    )));
                }
            }
        }
    }
}
