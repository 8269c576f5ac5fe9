//! Readers of Core's public API that ask for large event pages and read them slowly cost
//! memory bounded by Core's answer budget, and each still gets its whole, correct page:
//! pages are bounded in bytes and built against one shared budget (`gateway::http`), a
//! reader past it waits for budget (backpressure), and nothing is dropped.
//!
//! Core runs with a small budget ([`BUDGET`], `limits.response_bytes_in_flight`) so that
//! the memory bound discriminates: a hundred readers of a 1 MiB page each would cost
//! about 100 MiB without the budget (and up to the 64 MiB default with it). Nothing here
//! is timed: the peak is the kernel's high-water mark of Core's resident memory, read
//! after every reader is done, and the write-stall timeout (which drops a connection
//! whose reader accepts nothing; its unit test is in `gateway::http`) is set far beyond
//! any run, so no reader is dropped however slow the machine is.

mod common;

use common::{API_KEY, Core, Runtime};
use contract_impl::core_runtime::gateway::api::EVENTS_PAGE_BYTES_MAX;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Readers opened at once: each asks for a full page, and reads it only once every
/// request was sent and Core answered one (then a KiB at a time).
const READERS: usize = 100;
/// Deltas stored in the Turn, of [`DELTA_BYTES`] each (2.4 MB in all): a page of
/// `limit=1000` stops at the page byte bound (1 MiB), about 130 events.
const DELTAS: usize = 300;
const DELTA_BYTES: usize = 8_000;
/// The answer budget Core runs with: room for three pages.
const BUDGET: usize = 4 * 1024 * 1024;
/// Peak memory Core may grow by while the readers are served, in MiB: the budget's pages
/// (each built once and held until handed to its connection), what building a page
/// costs on top of its bytes (the events loaded from the store, the growing buffer),
/// and each connection's bounded HTTP buffers (`HTTP_BUFFER_MAX`), and the allocator's
/// slack. From 5 to 15 MiB measured with both cores busy; with the default 64 MiB
/// budget Core grows by about 67 MiB.
const GROWTH_MAX_MIB: u64 = 6 * (BUDGET as u64 >> 20);

/// Peak resident memory of `pid` (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// The body of one HTTP/1.1 answer read to its end (the request said
/// `Connection: close`), after checking its status and `Content-Length`.
fn body_of(answer: &[u8]) -> &[u8] {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an answer with a header block");
    let head = std::str::from_utf8(&answer[..end]).unwrap();
    let body = &answer[end + 4..];
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no Content-Length: {head}"));
    assert_eq!(body.len(), length, "a page cut short");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_cost_the_budget_and_each_gets_its_whole_page() {
    let core = Core::start_with(
        r#""http_write_stall_ms":86400000"#,
        &format!(r#""response_bytes_in_flight":{BUDGET}"#),
    );
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

    // The page every reader must get, read by an ordinary client first.
    let expected = common::api_client()
        .get(format!("{}/v1/turns/{turn}/events?limit=1000", core.base))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let page: Value = serde_json::from_slice(&expected).unwrap();
    let events = page["events"].as_array().unwrap();
    // The page byte bound: fewer events than asked for, within 1 MiB plus one event.
    assert!(
        events.len() > 1 && events.len() < DELTAS,
        "{} events",
        events.len()
    );
    assert!(
        expected.len() <= EVENTS_PAGE_BYTES_MAX + 2 * DELTA_BYTES,
        "a page of {} bytes",
        expected.len()
    );
    assert_eq!(
        page["next_after_sequence"],
        events.last().unwrap()["sequence"]
    );
    // A hundred such pages are far more than the budget and the bound below.
    assert!(READERS * expected.len() > 4 * ((GROWTH_MAX_MIB as usize) << 20));
    let before = peak_rss_kib(core.pid());

    let addr = core.base.trim_start_matches("http://").to_string();
    let request = format!(
        "GET /v1/turns/{turn}/events?limit=1000 HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {API_KEY}\r\nConnection: close\r\n\r\n"
    );
    let (go_tx, go) = tokio::sync::watch::channel(false);
    let (answered_tx, mut answered) = tokio::sync::mpsc::unbounded_channel();
    let mut readers = Vec::new();
    for _ in 0..READERS {
        // A small receive window, so an unread page cannot hide in the kernel's buffers.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut tcp = socket.connect(addr.parse().unwrap()).await.unwrap();
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut go = go.clone();
        let answered = answered_tx.clone();
        readers.push(tokio::spawn(async move {
            // Nothing is read until every request was sent and one answer began.
            tcp.readable().await.unwrap();
            let _ = answered.send(());
            go.wait_for(|go| *go).await.unwrap();
            let mut answer = Vec::new();
            let mut buf = [0u8; 1024];
            loop {
                let n = tcp.read(&mut buf).await.unwrap();
                if n == 0 {
                    return answer;
                }
                answer.extend_from_slice(&buf[..n]);
                tokio::task::yield_now().await;
            }
        }));
    }
    drop(answered_tx);
    answered.recv().await.expect("Core answered no reader");
    go_tx.send(true).unwrap();

    // Backpressure, not loss: every reader gets the whole page, byte for byte.
    for (i, reader) in readers.into_iter().enumerate() {
        let answer = reader.await.unwrap();
        assert!(
            body_of(&answer) == expected.as_ref(),
            "reader {i} got a different page"
        );
    }

    // The peak over the whole run: pages were built against the budget, not all at once.
    let grown_kib = peak_rss_kib(core.pid()).saturating_sub(before);
    eprintln!(
        "{READERS} readers of a {} byte page, budget {} MiB: Core's peak memory grew by \
         {grown_kib} KiB",
        expected.len(),
        BUDGET >> 20
    );
    assert!(
        grown_kib < GROWTH_MAX_MIB << 10,
        "Core's peak memory grew by {grown_kib} KiB, over {GROWTH_MAX_MIB} MiB with a \
         budget of {} MiB",
        BUDGET >> 20
    );
}
