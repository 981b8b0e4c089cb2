//! kforge optimize's LLM agents and the search loop over them.
pub mod analyst;
pub mod candidate;
pub mod context;
pub mod prompt;
