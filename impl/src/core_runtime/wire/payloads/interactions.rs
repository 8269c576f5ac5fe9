//! Interactions.

use super::*;

/// `permission_request` (Runtime → Core). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionRequest {
    /// The interaction ID.
    pub request_id: InteractionId,
    /// Tool asking for permission.
    pub tool_name: BoundedString<128>,
    /// What would happen.
    pub description: BoundedString<8192>,
}

/// `permission_cancel` (Runtime → Core). `Envelope.id`: the interaction ID.
/// The native side withdrew the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionCancel {
    /// The Run the request belonged to.
    pub run_id: RunId,
}

/// A permission decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PermissionVerdict {
    /// Allow once.
    Allow,
    /// Deny.
    Deny,
}

/// `permission_decision` (Core → Runtime). `Envelope.id`: the interaction ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionDecision {
    /// This resolve attempt.
    pub delivery_id: DeliveryId,
    /// The decision.
    pub decision: PermissionVerdict,
}

/// One option of a question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChoiceOption {
    /// Label (also the answer value).
    pub label: BoundedString<256>,
    /// Optional description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<BoundedString<1024>>,
}

/// One question of a user-choice prompt. Order and header do not identify answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// Identity of the question.
    pub question_id: InteractionId,
    /// Display header.
    pub header: BoundedString<256>,
    /// Question text.
    pub question: BoundedString<4096>,
    /// Options.
    pub options: BoundedVec<ChoiceOption, CHOICES_MAX>,
    /// Whether several answers may be chosen.
    pub multi_select: bool,
}

/// `prompt_for_user_choice` (Runtime → Core). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptForUserChoice {
    /// The interaction ID.
    pub ask_id: InteractionId,
    /// The questions.
    pub questions: BoundedVec<Question, QUESTIONS_MAX>,
}

/// One provided answer: explicit `question_id`, `answers` (empty = explicitly not answered).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuestionAnswer {
    /// The question answered.
    pub question_id: InteractionId,
    /// Chosen labels.
    pub answers: BoundedVec<BoundedString<256>, CHOICES_MAX>,
}

/// `prompt_for_user_choice_decision` (Core → Runtime). `Envelope.id`: the interaction ID.
///
/// Exactly one shape is valid: `question_answers` (no `cancelled`), or
/// `cancelled: true` with no answers; see [`validate_question_answers`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptForUserChoiceDecision {
    /// This resolve attempt.
    pub delivery_id: DeliveryId,
    /// Answers; omitted questions stay unanswered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question_answers: Option<BoundedVec<QuestionAnswer, QUESTIONS_MAX>>,
    /// `true` for a cancellation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<bool>,
}

/// Why a user-choice decision has an invalid shape ("Envelope and identity").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuestionAnswersError {
    /// Neither answers nor `cancelled: true`, or `cancelled: false`.
    #[error("a decision carries question_answers or cancelled: true")]
    NoShape,
    /// Both `cancelled: true` and answers.
    #[error("a cancellation carries no answers")]
    CancelledWithAnswers,
    /// An answer names a question that was not asked.
    #[error("question `{0}` was not asked")]
    UnknownQuestion(String),
    /// Two answers name the same question.
    #[error("question `{0}` is answered twice")]
    RepeatedQuestion(String),
}

/// Shared validation of a user-choice decision against the asked questions.
///
/// # Errors
/// [`QuestionAnswersError`] for any shape other than the two the spec allows.
pub fn validate_question_answers(
    asked: &[Question],
    decision: &PromptForUserChoiceDecision,
) -> Result<(), QuestionAnswersError> {
    match (&decision.question_answers, decision.cancelled) {
        (None, Some(true)) => Ok(()),
        (Some(_), Some(true)) => Err(QuestionAnswersError::CancelledWithAnswers),
        (None, _) | (Some(_), Some(false)) => Err(QuestionAnswersError::NoShape),
        (Some(answers), None) => {
            let mut seen = std::collections::HashSet::new();
            for answer in answers.iter() {
                let id = answer.question_id.as_str();
                if !asked.iter().any(|q| q.question_id.as_str() == id) {
                    return Err(QuestionAnswersError::UnknownQuestion(id.to_string()));
                }
                if !seen.insert(id) {
                    return Err(QuestionAnswersError::RepeatedQuestion(id.to_string()));
                }
            }
            Ok(())
        }
    }
}

/// The operation an `interaction_decision_ack` settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AckOperation {
    /// A `permission_decision`.
    PermissionDecision,
    /// A `prompt_for_user_choice_decision`.
    PromptForUserChoiceDecision,
    /// A `function_result`.
    FunctionResult,
    /// A `prompt_cancel` (the cancel receipt).
    PromptCancel,
}

/// Bounded error categories of decision acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AckErrorCode {
    /// The decision shape failed shared validation.
    InvalidDecision,
    /// No pending interaction, call or Run with this identity on this connection.
    UnknownInteraction,
    /// The interaction was already resolved by another delivery.
    AlreadyResolved,
    /// The native side refused or failed to apply the operation.
    NativeFailure,
    /// The operation needs a capability the owner was not admitted with.
    UnsupportedOperation,
    /// Native settlement could not be confirmed.
    SettlementUnknown,
}

/// Confirmed continuity snapshot of a stopped Turn, carried by a cancel receipt
/// when no `done` was emitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContinuitySnapshot {
    /// Partial text observed before the stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Text>,
    /// Native Session identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_session_id: Option<NativeSessionId>,
    /// Last cumulative usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `interaction_decision_ack` (Runtime → Core). `Envelope.id`: the interaction ID for
/// decisions, the Run ID for cancel and function-result acknowledgements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InteractionDecisionAck {
    /// What was settled.
    pub operation: AckOperation,
    /// Must match the delivery ID of the request it acknowledges.
    pub delivery_id: DeliveryId,
    /// `true` only when the named operation settled natively.
    pub applied: bool,
    /// Function call this acknowledges (function results only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<CallId>,
    /// Why it was not applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<AckErrorCode>,
    /// Cancel receipts without a published `done` carry the continuity snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<ContinuitySnapshot>,
}
