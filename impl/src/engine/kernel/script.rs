//! The scripted kernel's program: what a run of the `scripted` definition does, read from
//! its initial message, so every rule of the protocol can be made observable by a client
//! (or a scenario) without a model behind the daemon.
//!
//! A message whose first line is `#!script` is a program, one directive per line:
//!
//! | directive                      | effect                                              |
//! |--------------------------------|-----------------------------------------------------|
//! | `say TEXT`                     | one `MessageDelta` with `TEXT`                      |
//! | `repeat N TEXT`                | `N` `MessageDelta`s (`N` ≤ [`REPEAT_MAX`])          |
//! | `turn`                         | one `TurnCompleted`: a safe boundary for suspension |
//! | `tool NAME OUTCOME`            | one `ToolOutcome` (`succeeded`, `failed`, `uncertain`) |
//! | `ask ID PROMPT`                | opens interaction `ID` and waits for its response   |
//! | `hold`                         | waits until suspended (then continues) or canceled  |
//! | `fail`                         | ends the run `failed` (an expected business failure) |
//! | `panic`                        | the executor panics (contained: `uncertain`)        |
//!
//! Any other message is a conversation: one `MessageDelta` echoing it and one turn.
//! A run that reaches the end of its program ends `succeeded`.
//!
//! This module parses and validates; it does no I/O and never runs anything.

/// Most deltas one `repeat` emits.
pub const REPEAT_MAX: u64 = 1_000_000;

/// Most directives in one program.
pub const DIRECTIVES_MAX: usize = 4_096;

/// Longest interaction ID, bytes.
pub const INTERACTION_ID_MAX_BYTES: usize = 128;

/// The first line that marks a message as a program.
pub const SCRIPT_MARK: &str = "#!script";

/// A tool outcome a program may script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolResult {
    /// The tool succeeded.
    Succeeded,
    /// The tool failed (an explicit outcome).
    Failed,
    /// The tool's acknowledgement was lost: never replayed automatically.
    Uncertain,
}

/// One step of a program.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Directive {
    /// One delta.
    Say {
        /// The text.
        text: String,
    },
    /// `count` deltas of `text`.
    Repeat {
        /// How many.
        count: u64,
        /// The text.
        text: String,
    },
    /// A completed turn.
    Turn,
    /// A tool outcome.
    Tool {
        /// The tool's name.
        name: String,
        /// Its outcome.
        result: ToolResult,
    },
    /// An interaction that blocks the run until answered.
    Ask {
        /// The interaction ID.
        id: String,
        /// The prompt.
        prompt: String,
    },
    /// Wait for a cancel or a suspension.
    Hold,
    /// End `failed`.
    Fail,
    /// Panic inside the executor.
    Panic,
}

/// Why a program is refused (the message names the line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ScriptError {
    /// 1-based line of the message.
    pub line: usize,
    /// Why.
    pub reason: String,
}

/// Reads `message` into its program.
///
/// # Errors
/// [`ScriptError`] for an unknown directive, a missing argument, a bound exceeded or a
/// duplicated interaction ID.
pub fn parse(message: &str) -> Result<Vec<Directive>, ScriptError> {
    let mut lines = message.lines();
    if lines.next().map(str::trim_end) != Some(SCRIPT_MARK) {
        return Ok(vec![
            Directive::Say {
                text: message.to_string(),
            },
            Directive::Turn,
        ]);
    }
    let mut program = Vec::new();
    let mut asked = std::collections::BTreeSet::new();
    for (index, raw) in lines.enumerate() {
        let line = index + 2;
        let err = |reason: &str| ScriptError {
            line,
            reason: reason.to_string(),
        };
        let raw = raw.trim_end();
        if raw.trim().is_empty() || raw.trim_start().starts_with('#') {
            continue;
        }
        let (word, rest) = raw.trim_start().split_once(' ').unwrap_or((raw.trim(), ""));
        let directive = match word {
            "say" => Directive::Say {
                text: rest.to_string(),
            },
            "repeat" => {
                let (n, text) = rest.split_once(' ').unwrap_or((rest, ""));
                let count: u64 = n
                    .parse()
                    .map_err(|_| err("repeat needs a count: repeat N TEXT"))?;
                if count == 0 || count > REPEAT_MAX {
                    return Err(err(&format!("repeat count must be 1..={REPEAT_MAX}")));
                }
                Directive::Repeat {
                    count,
                    text: text.to_string(),
                }
            }
            "turn" if rest.is_empty() => Directive::Turn,
            "tool" => {
                let (name, outcome) = rest
                    .split_once(' ')
                    .ok_or_else(|| err("tool needs a name and an outcome: tool NAME OUTCOME"))?;
                let result = match outcome.trim() {
                    "succeeded" => ToolResult::Succeeded,
                    "failed" => ToolResult::Failed,
                    "uncertain" => ToolResult::Uncertain,
                    _ => return Err(err("tool outcome must be succeeded, failed or uncertain")),
                };
                Directive::Tool {
                    name: name.to_string(),
                    result,
                }
            }
            "ask" => {
                let (id, prompt) = rest.split_once(' ').unwrap_or((rest, ""));
                if id.is_empty() || id.len() > INTERACTION_ID_MAX_BYTES {
                    return Err(err(&format!(
                        "ask needs an interaction ID of 1..={INTERACTION_ID_MAX_BYTES} bytes"
                    )));
                }
                if !asked.insert(id.to_string()) {
                    return Err(err(&format!("interaction {id} is asked twice")));
                }
                Directive::Ask {
                    id: id.to_string(),
                    prompt: prompt.to_string(),
                }
            }
            "hold" if rest.is_empty() => Directive::Hold,
            "fail" if rest.is_empty() => Directive::Fail,
            "panic" if rest.is_empty() => Directive::Panic,
            _ => return Err(err(&format!("unknown directive {word:?}"))),
        };
        program.push(directive);
        if program.len() > DIRECTIVES_MAX {
            return Err(err(&format!("at most {DIRECTIVES_MAX} directives")));
        }
    }
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_message_is_one_turn_of_echo() {
        assert_eq!(
            parse("hello").unwrap(),
            vec![
                Directive::Say {
                    text: "hello".into()
                },
                Directive::Turn
            ]
        );
    }

    #[test]
    fn programs_parse_and_bad_lines_are_named() {
        let p = parse(
            "#!script\nsay hi there\n# note\nrepeat 3 x\nturn\ntool ls uncertain\nask q1 Proceed?\nhold\nfail",
        )
        .unwrap();
        assert_eq!(p.len(), 7);
        assert_eq!(
            p[4],
            Directive::Ask {
                id: "q1".into(),
                prompt: "Proceed?".into()
            }
        );
        assert_eq!(parse("#!script\nsing").unwrap_err().line, 2);
        assert!(parse("#!script\nrepeat 0 x").is_err());
        assert!(parse(&format!("#!script\nrepeat {REPEAT_MAX} x")).is_ok());
        assert!(parse(&format!("#!script\nrepeat {} x", REPEAT_MAX + 1)).is_err());
        assert!(parse("#!script\nask a x\nask a y").is_err());
        assert!(parse("#!script\ntool ls maybe").is_err());
        let long = "q".repeat(INTERACTION_ID_MAX_BYTES);
        assert!(parse(&format!("#!script\nask {long} p")).is_ok());
        assert!(parse(&format!("#!script\nask {long}q p")).is_err());
    }
}
