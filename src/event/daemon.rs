//! The daemon's own events: its life, reloads and reconciles, components.

