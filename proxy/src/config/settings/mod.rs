//! The settings types the configuration file deserializes into, with their
//! defaults and validation, in one place. The runtime parts (budget,
//! enforce, predict, forward, requestheader) read them; nothing here
//! depends on a runtime part, so configuration sits below them all.

pub mod budget;
pub mod enforce;
pub mod forward;
pub mod predict;
pub mod requestheader;
pub mod shared;
