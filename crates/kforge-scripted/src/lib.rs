//! A local scripted OpenAI-compatible chat-completions endpoint, for testing and demonstrating
//! kforge's LLM loop without a model: a real HTTP/1.1 server (std only: a thread per
//! connection, keep-alive) that answers each request with the first rule of a [`Script`] whose
//! `when` strings all occur in the request's messages, and that can also answer with errors
//! (429 with `Retry-After`, 5xx), delays, dropped connections, malformed bodies and tool calls,
//! and slow streams.
//!
//! ```no_run
//! use kforge_scripted::{Script, Server};
//! let script = Script::load("script.json".as_ref())?;
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let server = Server::start(listener, script, None)?;
//! println!("{}", server.url()); // http://127.0.0.1:PORT/v1
//! server.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Routes: `POST /v1/chat/completions` (and `/chat/completions`), `GET /v1/models`,
//! `GET /health`; anything else is a 404 JSON error. The script format is documented on
//! [`Script`], [`Rule`] and [`ScriptedReply`]. An example: `tests/fixtures/vector_add/script.json`,
//! a planner, executor and summarizer run over vector_add (a 429 first, then plans, an honest
//! kernel, a cheating one, malformed arguments and then a syntax error).
//!
//! Conventions shared with kforge's agents: each agent's system prompt begins with
//! `kforge <role> v<N>` (planner, executor, summarizer, synthesis), so rules match on e.g.
//! `"kforge planner"`; the tools are `submit_plans`, `submit_kernel`, `record_experience`,
//! `read_kernel`, `read_profile`, `search_memory`.

mod http;
mod respond;
mod script;
mod server;

pub use script::{Rule, Script, ScriptError, ScriptedReply, ScriptedToolCall, ScriptedUsage};
pub use server::Server;
