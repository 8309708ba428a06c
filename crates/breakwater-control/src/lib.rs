//! Pure control logic (placeholder).
