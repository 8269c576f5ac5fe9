//! `contract-impl worker bench`: the host ↔ worker round trip against its floor on this
//! machine (`make bench`; never a test). Three figures, each the median of per-round
//! times over `rounds` rounds:
//!
//! * **floor**: a bare Unix-socket ping-pong with a Python process that echoes 4-byte
//!   length-prefixed frames (same framing, same interpreter, no protocol);
//! * **empty cell**: `execute` of `None` to its `completed` through our host and worker;
//! * **host request**: one `runtime.inspect` request and its reply inside a cell.
//!
//! Each is reported in microseconds with its ratio to the floor.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use super::host::{BasicServices, HostConfig, Worker};

/// The Python echo of the floor: reads one frame, writes it back, until EOF.
const ECHO: &str = r#"
import os, socket, struct
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["BENCH_SOCKET"])
while True:
    h = s.recv(4, socket.MSG_WAITALL)
    if len(h) < 4: break
    (n,) = struct.unpack(">I", h)
    s.sendall(h + s.recv(n, socket.MSG_WAITALL))
"#;

/// One figure: median microseconds per round trip.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    /// Median of the rounds, µs.
    pub median_us: f64,
}

fn median(mut samples: Vec<Duration>) -> Figure {
    samples.sort();
    let mid = samples.get(samples.len() / 2).copied().unwrap_or_default();
    Figure {
        median_us: mid.as_secs_f64() * 1e6,
    }
}

/// The floor: `rounds` framed ping-pongs of a 100-byte payload with a Python echo.
///
/// # Errors
/// The echo could not be started or the socket failed.
pub async fn floor(rounds: usize) -> Result<Figure, String> {
    let dir = std::env::temp_dir().join(format!("cwb-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("echo.sock");
    let listener = UnixListener::bind(&path).map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new(super::python::interpreter())
        .args(["-c", ECHO])
        .env("BENCH_SOCKET", &path)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    let (mut conn, _) = listener.accept().await.map_err(|e| e.to_string())?;
    let payload = [b'x'; 100];
    let mut frame = 100u32.to_be_bytes().to_vec();
    frame.extend_from_slice(&payload);
    let mut back = vec![0u8; frame.len()];
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        conn.write_all(&frame).await.map_err(|e| e.to_string())?;
        conn.read_exact(&mut back)
            .await
            .map_err(|e| e.to_string())?;
        samples.push(start.elapsed());
    }
    drop(conn);
    let _ = child.wait().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(median(samples))
}

/// The empty cell and the host request through our host and `program`.
///
/// # Errors
/// The worker could not start, or a cell failed.
pub async fn protocol(
    program: Vec<std::ffi::OsString>,
    rounds: usize,
) -> Result<(Figure, Figure), String> {
    let mut worker = Worker::spawn(HostConfig::workbench(program))
        .await
        .map_err(|e| e.to_string())?;
    let mut services = BasicServices;
    let mut cells = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        worker
            .execute("None", &mut services)
            .await
            .map_err(|e| e.to_string())?;
        cells.push(start.elapsed());
    }
    // One cell of `rounds` requests (at most the per-cell bound each), timed per request
    // as the cell's time over its requests, less one empty cell.
    let per_cell = super::wire::limits::REQUESTS_PER_CELL_MAX;
    let mut requests = Vec::new();
    let empty = median(cells.clone()).median_us;
    let mut left = rounds;
    while left > 0 {
        let n = left.min(per_cell);
        let code = format!("for _ in range({n}):\n    await runtime.inspect()");
        let start = Instant::now();
        worker
            .execute(&code, &mut services)
            .await
            .map_err(|e| e.to_string())?;
        let total = start.elapsed().as_secs_f64() * 1e6 - empty;
        requests.push(Duration::from_secs_f64((total / n as f64).max(0.0) / 1e6));
        left -= n;
    }
    worker.shutdown(super::host::SHUTDOWN_GRACE).await;
    Ok((median(cells), median(requests)))
}
