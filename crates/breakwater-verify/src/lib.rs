//! Webhook signature verification (placeholder).
