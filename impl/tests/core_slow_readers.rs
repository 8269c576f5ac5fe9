//! Readers of Core's public API that ask for large event pages and do not read them
//! cost bounded memory and never starve a reader that does: pages are bounded in bytes
//! and built against one shared budget (`gateway::http`; the write-stall timeout that
//! drops a connection whose reader accepts nothing has its unit test there).

mod common;

use std::time::Duration;

use common::{API_KEY, Core, Runtime};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// Readers opened at once: each asks for a full page and never reads it.
const STALLED_READERS: usize = 100;
/// Deltas stored in the Turn, of [`DELTA_BYTES`] each (2.4 MB in all): a page of
/// `limit=1000` stops at the page byte bound (1 MiB), about 130 events.
const DELTAS: usize = 300;
const DELTA_BYTES: usize = 8_000;

/// Peak resident memory of `pid` (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_pages_are_bounded_and_do_not_starve_a_reader() {
    let core = Core::start(r#""http_write_stall_ms":300"#);
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "none").await;
    let turn = api.turn(&session, "hello").await;
    let run = rt.run().await;
    let text = "x".repeat(DELTA_BYTES);
    for _ in 0..DELTAS {
        rt.event(&run, "delta", json!({ "text": text })).await;
    }
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&turn, "completed").await;
    let before = peak_rss_kib(core.pid());

    let addr = core.base.trim_start_matches("http://").to_string();
    let request = format!(
        "GET /v1/turns/{turn}/events?limit=1000 HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {API_KEY}\r\n\r\n"
    );
    let mut stalled = Vec::new();
    for _ in 0..STALLED_READERS {
        // A small receive window, so the page cannot hide in the kernel's buffers.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut tcp = socket.connect(addr.parse().unwrap()).await.unwrap();
        tcp.write_all(request.as_bytes()).await.unwrap();
        stalled.push(tcp);
    }

    // A reader that does read gets its whole page meanwhile (it may wait for budget
    // the stalled ones release when their connections are dropped).
    let page: Value = tokio::time::timeout(
        Duration::from_secs(60),
        common::api_client()
            .get(format!("{}/v1/turns/{turn}/events?limit=1000", core.base))
            .send(),
    )
    .await
    .expect("a reading client starved behind stalled ones")
    .unwrap()
    .json()
    .await
    .unwrap();
    let events = page["events"].as_array().unwrap();
    // The page byte bound: fewer events than asked for, within 1 MiB plus one event.
    assert!(
        events.len() > 1 && events.len() < DELTAS,
        "{} events",
        events.len()
    );
    let bytes = serde_json::to_vec(&page).unwrap().len();
    assert!(
        bytes <= 1024 * 1024 + 2 * DELTA_BYTES,
        "a page of {bytes} bytes"
    );
    assert_eq!(
        page["next_after_sequence"],
        events.last().unwrap()["sequence"]
    );

    // Peak memory grew by far less than a page per unread reader (1 MiB each): pages
    // are built against the answer budget, not all at once.
    let grown_mib = (peak_rss_kib(core.pid()) - before) / 1024;
    assert!(grown_mib < 90, "Core's peak memory grew by {grown_mib} MiB");
    drop(stalled);
}
