//! Tessera UI.
