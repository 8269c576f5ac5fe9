//! Controlled Harness adapter (being written).
