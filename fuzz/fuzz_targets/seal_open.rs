//! Opening sealed values (`requestState`, pagination cursors, legacy session
//! ids) from arbitrary
//! strings: never a panic, and never accepted unless byte-identical to a
//! blob the gateway sealed.
//!
//! Input: first as text, then as edits to a freshly sealed blob (byte 0
//! picks which; then pairs of position and operation: flip bits, insert,
//! remove, truncate), so the fuzzer works near valid blobs too.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use sessionless::fuzzing::Seals;

struct Fixture {
    seals: Seals,
    state: String,
    cursor: String,
    session: String,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let seals = Seals::default();
    let (state, cursor, session) = (seals.seal_state(), seals.seal_cursor(), seals.seal_session());
    assert!(
        seals.open_state(&state) && seals.open_cursor(&cursor) && seals.open_session(&session),
        "the fixture opens its own blobs"
    );
    Fixture { seals, state, cursor, session }
});

fn check(f: &Fixture, blob: &str) {
    assert!(!f.seals.open_state(blob) || blob == f.state, "a forged requestState opened: {blob:?}");
    assert!(!f.seals.open_cursor(blob) || blob == f.cursor, "a forged cursor opened: {blob:?}");
    assert!(!f.seals.open_session(blob) || blob == f.session, "a forged session id opened: {blob:?}");
}

fn edit(blob: &mut Vec<u8>, at: u8, op: u8) {
    let pos = usize::from(at) * blob.len() / 256;
    match op >> 6 {
        0 if pos < blob.len() => blob[pos] ^= op & 0x3f | 1,
        1 => blob.insert(pos, b"AZaz09-_=+/."[usize::from(op & 0x3f) % 12]),
        2 if pos < blob.len() => {
            blob.remove(pos);
        }
        _ => blob.truncate(pos),
    }
}

fuzz_target!(|input: &[u8]| {
    let f = &*FIXTURE;
    check(f, &String::from_utf8_lossy(input));
    let [which, edits @ ..] = input else { return };
    let mut blob = match which % 3 {
        0 => f.state.clone(),
        1 => f.cursor.clone(),
        _ => f.session.clone(),
    }
    .into_bytes();
    for pair in edits.chunks_exact(2) {
        edit(&mut blob, pair[0], pair[1]);
    }
    check(f, &String::from_utf8_lossy(&blob));
});
