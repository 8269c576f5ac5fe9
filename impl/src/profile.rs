//! The `--profile` every target of ours takes for the suite's vendor-mode trials: our
//! reference choices, or another correct implementation's where the spec leaves a choice
//! free (codes and texts of refusals, origins, orders, spellings). Each family reads it
//! into its own settings; this module owns only the argument.

/// `--profile reference|different`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfileArg {
    /// Our reference choices.
    #[default]
    Reference,
    /// Another correct implementation's choices.
    Different,
}

impl ProfileArg {
    /// Whether this is the other implementation's profile.
    pub fn is_different(self) -> bool {
        self == ProfileArg::Different
    }
}
