//! Bridges run a validated call against an upstream and shape the modern
//! answer. Only the legacy (session-based) bridge exists so far.

pub mod legacy;
