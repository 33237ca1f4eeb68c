//! Triggers' events (`webhook.*`, `trigger.*`).

