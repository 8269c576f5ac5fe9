//! A bounded tail of a program's output: the last lines, at most so many bytes, each
//! line cut (and marked `…`) at the line bound. Memory is bounded whatever the program
//! writes; invalid UTF-8 is converted lossily; nothing here can fail.

use std::collections::VecDeque;

/// The last lines of an output stream.
#[derive(Debug)]
pub struct OutputTail {
    max_lines: usize,
    max_bytes: usize,
    max_line_bytes: usize,
    lines: VecDeque<String>,
    bytes: usize,
    partial: Vec<u8>,
    partial_cut: bool,
}

impl OutputTail {
    /// A tail of at most `max_lines` lines and `max_bytes` bytes, each line cut at
    /// `max_line_bytes` (each bound at least 1; the line bound at most `max_bytes`).
    pub fn new(max_lines: usize, max_bytes: usize, max_line_bytes: usize) -> Self {
        let max_bytes = max_bytes.max(1);
        Self {
            max_lines: max_lines.max(1),
            max_bytes,
            max_line_bytes: max_line_bytes.clamp(1, max_bytes),
            lines: VecDeque::new(),
            bytes: 0,
            partial: Vec::new(),
            partial_cut: false,
        }
    }

    /// Appends raw output bytes (any chunking; a line may span chunks). `\r\n` ends a
    /// line like `\n`.
    pub fn push(&mut self, chunk: &[u8]) {
        for piece in chunk.split_inclusive(|b| *b == b'\n') {
            let (body, complete) = match piece.strip_suffix(b"\n") {
                Some(body) => (body, true),
                None => (piece, false),
            };
            let room = self.max_line_bytes.saturating_sub(self.partial.len());
            if body.len() > room {
                self.partial.extend_from_slice(&body[..room]);
                self.partial_cut = true;
            } else {
                self.partial.extend_from_slice(body);
            }
            if complete {
                self.finish_line();
            }
        }
    }

    fn finish_line(&mut self) {
        if self.partial.last() == Some(&b'\r') {
            self.partial.pop();
        }
        let mut line = String::from_utf8_lossy(&self.partial).into_owned();
        if self.partial_cut {
            line.push('…');
        }
        self.partial.clear();
        self.partial_cut = false;
        self.bytes += line.len();
        self.lines.push_back(line);
        while self.lines.len() > self.max_lines
            || (self.bytes > self.max_bytes && self.lines.len() > 1)
        {
            if let Some(old) = self.lines.pop_front() {
                self.bytes -= old.len();
            }
        }
    }

    /// The complete lines kept, oldest first (the unterminated last line is not one).
    pub fn lines(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().map(String::as_str)
    }

    /// The last line that is not blank (the unterminated one included), trimmed.
    pub fn last_line(&self) -> Option<String> {
        let partial = String::from_utf8_lossy(&self.partial);
        if !partial.trim().is_empty() {
            return Some(partial.trim().to_string());
        }
        self.lines
            .iter()
            .rev()
            .map(|l| l.trim())
            .find(|l| !l.is_empty())
            .map(str::to_string)
    }

    /// The tail as text: complete lines, then any unterminated last line, joined by
    /// `\n`, at most `max_lines` lines and `max_bytes` bytes (oldest lines dropped).
    pub fn text(&self) -> String {
        let partial = (!self.partial.is_empty()).then(|| String::from_utf8_lossy(&self.partial));
        let keep = self.max_lines - usize::from(partial.is_some());
        let skip = self.lines.len().saturating_sub(keep);
        let mut out: Vec<String> = self.lines.iter().skip(skip).cloned().collect();
        out.extend(partial.map(|p| p.into_owned()));
        let mut text = out.join("\n");
        while text.len() > self.max_bytes {
            match text.find('\n') {
                Some(i) => text.drain(..=i),
                None => break,
            };
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_bytes_are_bounded() {
        let mut tail = OutputTail::new(3, 64, 64);
        for i in 0..10 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        assert_eq!(tail.text(), "line 7\nline 8\nline 9");
        assert_eq!(tail.lines().count(), 3);
        let mut tail = OutputTail::new(100, 16, 16);
        tail.push(b"aaaaaaaaaa\nbbbbbbbbbb\n");
        assert_eq!(tail.text(), "bbbbbbbbbb");
    }

    #[test]
    fn long_lines_are_cut_and_chunks_join() {
        let mut tail = OutputTail::new(4, 64, 8);
        tail.push(b"0123");
        tail.push(b"456789\nok");
        assert_eq!(tail.lines().collect::<Vec<_>>(), ["01234567…"]);
        assert_eq!(tail.last_line().as_deref(), Some("ok"));
        tail.push(b"\r\n  \n");
        assert_eq!(tail.last_line().as_deref(), Some("ok"));
        tail.push(&[0xff, b'\n']);
        assert_eq!(tail.last_line().as_deref(), Some("\u{fffd}"));
    }
}
