//! Writing the program's stdin.

use super::*;

/// Writes and flushes `bytes`. A broken pipe on a write of at most
/// [`PIPE_BUF_BYTES`] proves nothing was read (`Refused`); otherwise a failure leaves
/// the outcome unknown.
pub(super) async fn write_stdin(pipe: &mut StdinPipe, bytes: &[u8]) -> Result<(), AdapterError> {
    if pipe.interrupted {
        return Err(AdapterError::Refused(
            "an earlier write to stdin was interrupted; the pipe may hold a partial line".into(),
        ));
    }
    pipe.interrupted = true;
    let Some(writer) = pipe.pipe.as_mut() else {
        pipe.interrupted = false;
        return Err(AdapterError::Refused(
            "the program's stdin is closed".into(),
        ));
    };
    let written = async {
        writer.write_all(bytes).await?;
        writer.flush().await
    }
    .await;
    match written {
        Ok(()) => {
            pipe.interrupted = false;
            Ok(())
        }
        Err(e) => {
            pipe.pipe = None;
            if e.kind() == io::ErrorKind::BrokenPipe && bytes.len() <= PIPE_BUF_BYTES {
                pipe.interrupted = false;
                Err(AdapterError::Refused("the program closed its stdin".into()))
            } else {
                Err(AdapterError::Unknown(format!(
                    "writing to the program's stdin failed: {e}"
                )))
            }
        }
    }
}
