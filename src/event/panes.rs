//! The pane host's events (`pane.*`, `pane_plugin.*`).

