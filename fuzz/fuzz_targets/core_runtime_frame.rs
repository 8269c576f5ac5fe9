//! The Core ↔ Runtime frame decoder (`contract_impl::core_runtime::wire::frame`):
//! `Frame::decode` in both directions and `decode_envelope`.
//!
//! Beyond "never panics": a frame that decodes has a well-formed Envelope, does not
//! decode from the other party (every message type has one direction), and encodes to
//! a text that decodes to the same frame; an Envelope that decodes encodes and decodes
//! to the same Envelope.
#![no_main]

use contract_impl::core_runtime::wire::frame::decode_envelope;
use contract_impl::core_runtime::wire::limits::TRANSPORT_FRAME_MAX_BYTES;
use contract_impl::core_runtime::wire::{Direction, Frame};
use contract_impl::wire::{WireError, encode_strict};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let envelope = decode_envelope(data);
    if let Ok(envelope) = &envelope {
        let text = encode_strict(envelope).expect("a decoded Envelope encodes");
        if text.len() <= TRANSPORT_FRAME_MAX_BYTES {
            assert_eq!(decode_envelope(text.as_bytes()).as_ref(), Ok(envelope));
        }
    }
    for (from, other) in [
        (Direction::CoreToRuntime, Direction::RuntimeToCore),
        (Direction::RuntimeToCore, Direction::CoreToRuntime),
    ] {
        let frame = match Frame::decode(data, from) {
            Ok(frame) => frame,
            Err(err) => {
                assert!(!err.code().is_empty());
                let _ = err.to_string();
                continue;
            }
        };
        assert!(envelope.is_ok(), "a frame decoded whose Envelope does not");
        assert_eq!(frame.message.message_type().direction(), from);
        assert!(matches!(
            Frame::decode(data, other),
            Err(WireError::WrongDirection(_))
        ));
        let text = frame.encode().expect("a decoded frame encodes");
        // Re-encoding can lengthen a frame (`1e2` is written `100.0`): past the
        // transport bound the copy is rightly refused.
        if text.len() <= TRANSPORT_FRAME_MAX_BYTES {
            assert_eq!(Frame::decode(text.as_bytes(), from), Ok(frame));
        }
    }
});
