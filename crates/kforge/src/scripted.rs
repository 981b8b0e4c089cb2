//! `kforge scripted-endpoint SCRIPT`: serve a scripted OpenAI-compatible chat-completions
//! endpoint (`kforge_scripted`) until SIGINT or SIGTERM, for tests and demos of the LLM loop
//! without a model. The URL (`http://ADDR/v1`) goes to standard output and, with `--ready`, to
//! a file written atomically once the server listens.

use anyhow::{Context, Result};
use clap::Args;
use kforge_scripted::{Script, Server};
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ScriptedArgs {
    /// The script (JSON): {"reject_seed": bool, "rules": [{"name", "when": [strings all in the
    /// request's messages], "times", "status", "retry_after_s", "delay_ms", "chunk_delay_ms",
    /// "drop_connection", "body_raw", "reply": {"content" | "content_file", "content_parts",
    /// "reasoning_content", "tool_calls": [{"name", "arguments", "arguments_files",
    /// "arguments_raw", "arguments_as_object"}], "finish_reason", "usage"}}]}. File paths inside
    /// it are relative to its directory.
    script: PathBuf,
    /// The address to listen on (port 0: any free port; the URL printed says which).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Once listening, write the URL to this file (atomically: a temporary file renamed), so a
    /// test or a script can wait for it.
    #[arg(long)]
    ready: Option<PathBuf>,
    /// Append every request to this JSONL file, one line each, flushed, when it is read: {"n",
    /// "path", "rule", "rule_index", "status", "dropped", "stream", "seed_sent", "request"}.
    #[arg(long)]
    log: Option<PathBuf>,
}

/// Serve the script until SIGINT or SIGTERM; exit 0 after a clean shutdown.
pub fn scripted_endpoint(args: ScriptedArgs) -> Result<i32> {
    let script = Script::load(&args.script)?;
    // Blocked before the server starts its threads, so they inherit the mask and the signals
    // wait for `wait` below instead of killing the process.
    let signals = kforge_daemon::signals::ShutdownSignals::block();
    let listener = TcpListener::bind(&args.listen).with_context(|| format!("listening on {}", args.listen))?;
    let server = Server::start(listener, script, args.log.clone()).with_context(|| match &args.log {
        Some(log) => format!("starting the scripted endpoint (log {})", log.display()),
        None => "starting the scripted endpoint".to_owned(),
    })?;
    let url = server.url();
    announce(&url, args.ready.as_deref())?;
    let signal = signals.wait().context("waiting for SIGINT or SIGTERM");
    let signal = match signal {
        Ok(signal) => signal,
        Err(e) => {
            server.shutdown();
            return Err(e);
        }
    };
    eprintln!("kforge scripted-endpoint: signal {signal}: stopping after {} requests", server.requests_served());
    server.shutdown();
    Ok(0)
}

/// Print the URL (flushed) and write the ready file.
fn announce(url: &str, ready: Option<&Path>) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{url}").and_then(|_| stdout.flush()).context("writing the URL to standard output")?;
    if let Some(ready) = ready {
        write_atomically(ready, &format!("{url}\n"))?;
    }
    Ok(())
}

/// Write `text` to `path` through a temporary file in the same directory and a rename, so a
/// reader sees either no file or the whole text.
fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let name = path.file_name().with_context(|| format!("the ready file {} has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp.{}", name.to_string_lossy(), std::process::id()));
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_file_is_written_whole_and_no_temporary_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("url");
        write_atomically(&ready, "http://127.0.0.1:1/v1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&ready).unwrap(), "http://127.0.0.1:1/v1\n");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("url")]);
    }

    #[test]
    fn a_ready_file_in_a_missing_directory_is_an_error_naming_it() {
        let error = write_atomically(Path::new("/nonexistent-dir/url"), "x").unwrap_err();
        assert!(format!("{error:#}").contains("writing /nonexistent-dir/.url.tmp."), "{error:#}");
    }
}
