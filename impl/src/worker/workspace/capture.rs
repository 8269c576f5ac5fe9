//! The bounded capture of a run's stdout and stderr ("max_output_bytes", of the spec's
//! `workspace.run` example). Nothing here can fail, and memory is bounded whatever the
//! program writes.
//!
//! Our reference choices (the spec names the bound, not how it applies):
//!
//! * One budget for both streams together, spent in the order the host reads the bytes;
//!   everything past it is still read (the program never blocks on a full pipe) and
//!   counted per stream (`stdout_truncated_bytes`, `stderr_truncated_bytes`), never kept.
//! * The texts are UTF-8 with every invalid sequence replaced by U+FFFD (lossy); a
//!   character the bound cut in two is dropped whole and counted as truncated, so a cut
//!   never invents a U+FFFD.
//! * The reply must fit one frame: where the JSON escaping of the kept texts would not
//!   fit [`Captured::fit`]'s budget, bytes are cut from the end of the longer text and
//!   counted as truncated as well.

/// One of the two streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The program's stdout.
    Stdout,
    /// The program's stderr.
    Stderr,
}

/// What one stream kept and how much of it was dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Kept {
    bytes: Vec<u8>,
    dropped: u64,
}

impl Kept {
    /// Moves the last `n` kept bytes (at most all) to the dropped count, then a
    /// character the cut left incomplete.
    fn cut(&mut self, n: usize) {
        let keep = self.bytes.len().saturating_sub(n);
        self.dropped += (self.bytes.len() - keep) as u64;
        self.bytes.truncate(keep);
        self.drop_incomplete_tail();
    }

    /// Drops a trailing incomplete UTF-8 sequence (a character cut in two).
    fn drop_incomplete_tail(&mut self) {
        let n = incomplete_tail_len(&self.bytes);
        self.bytes.truncate(self.bytes.len() - n);
        self.dropped += n as u64;
    }
}

/// Bytes at the end of `bytes` that begin a UTF-8 character without ending it (0..=3).
pub fn incomplete_tail_len(bytes: &[u8]) -> usize {
    (1..=3.min(bytes.len()))
        .find(|&k| {
            std::str::from_utf8(&bytes[bytes.len() - k..])
                .is_err_and(|e| e.valid_up_to() == 0 && e.error_len().is_none())
        })
        .unwrap_or(0)
}

/// The capture of both streams of one run under one byte budget.
#[derive(Debug, Clone)]
pub struct Capture {
    remaining: usize,
    stdout: Kept,
    stderr: Kept,
}

impl Capture {
    /// A capture keeping at most `max_bytes` of both streams together.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            remaining: max_bytes,
            stdout: Kept::default(),
            stderr: Kept::default(),
        }
    }

    /// Takes `chunk` read from `stream`: what the budget still allows is kept, the rest
    /// counted.
    pub fn push(&mut self, stream: Stream, chunk: &[u8]) {
        let take = chunk.len().min(self.remaining);
        self.remaining -= take;
        let kept = match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        kept.bytes.extend_from_slice(&chunk[..take]);
        kept.dropped += (chunk.len() - take) as u64;
    }

    /// The capture once both streams ended: a stream the budget cut loses a character
    /// the cut left incomplete.
    pub fn finish(mut self) -> Captured {
        for kept in [&mut self.stdout, &mut self.stderr] {
            if kept.dropped > 0 {
                kept.drop_incomplete_tail();
            }
        }
        Captured {
            stdout: self.stdout,
            stderr: self.stderr,
        }
    }
}

/// A finished capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    stdout: Kept,
    stderr: Kept,
}

impl Captured {
    /// The kept stdout, UTF-8 with invalid sequences replaced.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.bytes).into_owned()
    }

    /// The kept stderr, UTF-8 with invalid sequences replaced.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.bytes).into_owned()
    }

    /// Bytes the program wrote on stdout (kept or not).
    pub fn stdout_bytes(&self) -> u64 {
        self.stdout.bytes.len() as u64 + self.stdout.dropped
    }

    /// Bytes the program wrote on stderr (kept or not).
    pub fn stderr_bytes(&self) -> u64 {
        self.stderr.bytes.len() as u64 + self.stderr.dropped
    }

    /// Bytes of stdout read and not kept.
    pub fn stdout_truncated_bytes(&self) -> u64 {
        self.stdout.dropped
    }

    /// Bytes of stderr read and not kept.
    pub fn stderr_truncated_bytes(&self) -> u64 {
        self.stderr.dropped
    }

    /// Cuts the kept texts until `encoded_len(self)` (the length of what is sent) is at
    /// most `budget`: each round cuts the longer stream's end by the excess, scaled by
    /// what one of its bytes costs once encoded (a control character six bytes, a letter
    /// one), so that an escaped text is not cut more than it has to be.
    pub fn fit(&mut self, budget: usize, encoded_len: impl Fn(&Self) -> usize) {
        loop {
            let len = encoded_len(self);
            if len <= budget {
                return;
            }
            let longer = if self.stdout.bytes.len() >= self.stderr.bytes.len() {
                &mut self.stdout
            } else {
                &mut self.stderr
            };
            if longer.bytes.is_empty() {
                return;
            }
            let raw = longer.bytes.len();
            let encoded = serde_json::to_string(&String::from_utf8_lossy(&longer.bytes))
                .map_or(raw, |t| t.len())
                .max(1);
            // Every round cuts at least one byte, so the rounds end.
            let cut = ((len - budget) as u128 * raw as u128).div_ceil(encoded as u128);
            longer.cut(usize::try_from(cut).unwrap_or(usize::MAX).max(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_exact_at_the_bound_and_counts_one_past_it() {
        let mut at = Capture::new(16);
        at.push(Stream::Stdout, b"0123456789abcdef");
        let at = at.finish();
        assert_eq!(
            (at.stdout().as_str(), at.stdout_truncated_bytes()),
            ("0123456789abcdef", 0)
        );
        let mut past = Capture::new(16);
        past.push(Stream::Stdout, b"0123456789");
        past.push(Stream::Stdout, b"abcdefX");
        let past = past.finish();
        assert_eq!(
            (past.stdout().as_str(), past.stdout_truncated_bytes()),
            ("0123456789abcdef", 1)
        );
    }

    #[test]
    fn both_streams_share_the_budget_and_the_excess_is_counted_per_stream() {
        let mut c = Capture::new(10);
        c.push(Stream::Stdout, b"123456");
        c.push(Stream::Stderr, b"abcdef");
        c.push(Stream::Stdout, b"789");
        let c = c.finish();
        assert_eq!(
            (c.stdout().as_str(), c.stderr().as_str()),
            ("123456", "abcd")
        );
        assert_eq!(
            (c.stdout_truncated_bytes(), c.stderr_truncated_bytes()),
            (3, 2)
        );
    }

    #[test]
    fn a_character_cut_by_the_bound_is_dropped_whole_and_invalid_bytes_are_replaced() {
        // "é" is two bytes: the bound of 2 cuts the second character in two.
        let mut c = Capture::new(2);
        c.push(Stream::Stdout, "aéb".as_bytes());
        let c = c.finish();
        assert_eq!((c.stdout().as_str(), c.stdout_truncated_bytes()), ("a", 3));
        // The program's own invalid bytes are replaced, not counted.
        let mut c = Capture::new(64);
        c.push(Stream::Stderr, b"x\xffy\xe2\x82");
        let c = c.finish();
        assert_eq!(
            (c.stderr().as_str(), c.stderr_truncated_bytes()),
            ("x\u{fffd}y\u{fffd}", 0)
        );
        assert_eq!(incomplete_tail_len("€".as_bytes()), 0);
        assert_eq!(incomplete_tail_len(&"€".as_bytes()[..2]), 2);
        assert_eq!(incomplete_tail_len(b"\x82"), 0);
        assert_eq!(incomplete_tail_len(b""), 0);
    }

    #[test]
    fn fitting_cuts_the_longer_stream_until_the_encoding_fits() {
        let mut c = Capture::new(1000);
        // Control characters cost six bytes each once escaped.
        c.push(Stream::Stdout, &[1u8; 100]);
        c.push(Stream::Stderr, b"short");
        let mut c = c.finish();
        let encoded = |c: &Captured| {
            serde_json::to_string(&(c.stdout(), c.stderr()))
                .unwrap()
                .len()
        };
        assert!(encoded(&c) > 200);
        c.fit(200, encoded);
        assert!(encoded(&c) <= 200, "{}", encoded(&c));
        // Cut no more than needed: one more control character would not fit.
        assert!(encoded(&c) > 200 - 6, "{}", encoded(&c));
        assert_eq!(c.stderr(), "short");
        assert_eq!(
            c.stdout.bytes.len() as u64 + c.stdout_truncated_bytes(),
            100
        );
        // What was written stays counted, whatever was cut.
        assert_eq!((c.stdout_bytes(), c.stderr_bytes()), (100, 5));
    }
}
