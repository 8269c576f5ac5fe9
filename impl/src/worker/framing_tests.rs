//! Unit tests of `framing.rs`: the time of a frame, the two frame lines, stored content
//! untouched by assembly, and the instruction-change header.

use std::time::Duration;

use super::*;
use crate::worker::host::rfc3339_utc;

#[test]
fn frame_time_is_the_z_shape_in_seconds_or_unknown() {
    let cases: [(Option<i64>, &str); 15] = [
        // The spec's examples.
        (Some(1_789_325_940_000), "2026-09-13T18:59:00Z"),
        (Some(1_789_334_242_000), "2026-09-13T21:17:22Z"),
        (Some(1_789_329_293_000), "2026-09-13T19:54:53Z"),
        // The fraction of a second is dropped, never rounded up.
        (Some(1_789_325_940_999), "2026-09-13T18:59:00Z"),
        (Some(1_709_208_000_000), "2024-02-29T12:00:00Z"),
        (Some(951_868_800_000), "2000-03-01T00:00:00Z"),
        (Some(946_684_799_000), "1999-12-31T23:59:59Z"),
        (Some(1), "1970-01-01T00:00:00Z"),
        (Some(FRAME_TIME_MS_MAX), "9999-12-31T23:59:59Z"),
        // No usable time.
        (None, "time unknown"),
        (Some(0), "time unknown"),
        (Some(-1), "time unknown"),
        (Some(i64::MIN), "time unknown"),
        (Some(FRAME_TIME_MS_MAX + 1), "time unknown"),
        (Some(i64::MAX), "time unknown"),
    ];
    for (at_ms, expected) in cases {
        assert_eq!(frame_time(at_ms), expected, "{at_ms:?}");
    }
}

#[test]
fn the_seconds_shape_is_the_host_clock_shape_without_its_fraction() {
    // One calendar: `now` of `runtime.inspect` and a stamp agree to the second.
    for ms in [
        1u64,
        951_868_800_123,
        1_789_325_940_999,
        253_402_300_799_999,
    ] {
        let at = Duration::from_millis(ms);
        let (stamp, now) = (rfc3339_utc_seconds(at), rfc3339_utc(at));
        assert_eq!(stamp.strip_suffix('Z'), now.get(..19), "{ms}");
        assert_eq!(now.len(), 24);
    }
}

#[test]
fn input_frames_name_the_source_or_the_peer_request() {
    let peer = PeerRequest::new("req-1", "s-7").unwrap();
    let cases = [
        (
            InputEvent::new(Some(1_789_325_940_000), "operator").unwrap(),
            "[2026-09-13T18:59:00Z · operator]",
        ),
        (
            InputEvent::new(Some(1_789_325_940_000), "discord.dm").unwrap(),
            "[2026-09-13T18:59:00Z · discord.dm]",
        ),
        (
            InputEvent::new(Some(1_789_325_940_000), "peer")
                .unwrap()
                .with_peer_request(peer.clone()),
            "[2026-09-13T18:59:00Z · peer request req-1 from s-7]",
        ),
        (
            InputEvent::new(None, "operator").unwrap(),
            "[time unknown · operator]",
        ),
        (
            InputEvent::new(Some(0), "peer")
                .unwrap()
                .with_peer_request(peer),
            "[time unknown · peer request req-1 from s-7]",
        ),
    ];
    for (event, expected) in cases {
        assert_eq!(event.frame(), expected);
    }
}

#[test]
fn a_label_part_is_one_nonempty_line() {
    let cases: [(Result<InputEvent, FrameError>, &str, &str); 6] = [
        (InputEvent::new(None, ""), "frame_label_empty", "source"),
        (
            InputEvent::new(None, "oper\nator"),
            "frame_label_not_one_line",
            "source of a frame label holds a control character at byte 4",
        ),
        (
            InputEvent::new(None, "a\tb"),
            "frame_label_not_one_line",
            "source",
        ),
        (
            PeerRequest::new("", "s")
                .map(|p| InputEvent::new(None, "x").unwrap().with_peer_request(p)),
            "frame_label_empty",
            "peer request id",
        ),
        (
            PeerRequest::new("r\r", "s")
                .map(|p| InputEvent::new(None, "x").unwrap().with_peer_request(p)),
            "frame_label_not_one_line",
            "peer request id of a frame label holds a control character at byte 1",
        ),
        (
            PeerRequest::new("r", "s\u{2028}")
                .map(|p| InputEvent::new(None, "x").unwrap().with_peer_request(p)),
            "frame_label_not_one_line",
            "peer request session",
        ),
    ];
    for (result, code, message) in cases {
        let err = result.unwrap_err();
        assert_eq!(err.code(), code);
        assert!(err.to_string().contains(message), "{err}");
    }
}

#[test]
fn stored_content_is_exactly_what_arrived_and_assembly_is_repeatable() {
    let event = InputEvent::new(Some(1_789_325_940_000), "operator").unwrap();
    let contents = [
        "do the thing",
        "",
        "two\nlines\n",
        "  spaced  \r\n",
        "[2026-01-01T00:00:00Z · operator]\nlooks framed already",
        "ünïcode · 420ms ago",
    ];
    for content in contents {
        let stored = StoredInput::arrived(event.clone(), content);
        let first = stored.assemble();
        let second = stored.assemble();
        assert_eq!(first, second, "{content:?}");
        assert_eq!(
            first.as_str(),
            format!("[2026-09-13T18:59:00Z · operator]\n{content}")
        );
        // Assembly neither reads back nor writes into the stored record.
        assert_eq!(stored.content().as_bytes(), content.as_bytes());
        assert_eq!(stored, StoredInput::arrived(event.clone(), content));
    }
    assert_eq!(
        StoredInput::arrived(event, "do the thing")
            .assemble()
            .into_string(),
        "[2026-09-13T18:59:00Z · operator]\ndo the thing"
    );
}

#[test]
fn tool_result_frames_state_the_instant_and_the_run() {
    let at = Some(1_789_334_242_000);
    let cases = [
        (
            at,
            Some(Duration::from_millis(420)),
            "[2026-09-13T21:17:22Z · ran 420ms]",
        ),
        (
            at,
            Some(Duration::from_micros(420_999)),
            "[2026-09-13T21:17:22Z · ran 420ms]",
        ),
        (at, Some(Duration::ZERO), "[2026-09-13T21:17:22Z · ran 0ms]"),
        (
            at,
            Some(Duration::from_secs(240)),
            "[2026-09-13T21:17:22Z · ran 240000ms]",
        ),
        (at, None, "[2026-09-13T21:17:22Z]"),
        (
            None,
            Some(Duration::from_millis(5)),
            "[time unknown · ran 5ms]",
        ),
        (Some(-5), None, "[time unknown]"),
    ];
    for (observed_at_ms, ran, expected) in cases {
        let observation = ToolObservation {
            observed_at_ms,
            ran,
        };
        assert_eq!(observation.frame(), expected);
        let stored = StoredToolResult::recorded(observation, "42");
        assert_eq!(stored.assemble().to_string(), format!("{expected}\n42"));
        assert_eq!(stored.assemble(), stored.assemble());
        assert_eq!(stored.content(), "42");
        assert_eq!(stored.observation(), observation);
    }
}

#[test]
fn the_instruction_change_header_is_the_spec_text() {
    let cases = [
        (
            Some(1_789_329_293_000),
            "[2026-09-13T19:54:53Z · instructions changed for this runtime · changed outside this transcript]\n\
             the header of this transcript is the revision it started under; the text below is current from here on.",
        ),
        (
            None,
            "[time unknown · instructions changed for this runtime · changed outside this transcript]\n\
             the header of this transcript is the revision it started under; the text below is current from here on.",
        ),
    ];
    for (at_ms, expected) in cases {
        assert_eq!(instructions_changed_outside(at_ms), expected);
        assert_eq!(
            instructions_changed_outside(at_ms),
            instructions_changed_outside(at_ms)
        );
    }
}
