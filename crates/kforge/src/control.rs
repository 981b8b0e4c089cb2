//! `kforge cancel` and `kforge shutdown`: one request each to the daemon.

use anyhow::Result;
use kforge_client::Client;
use kforge_proto::Request;
use std::path::Path;

#[derive(clap::Args)]
pub struct CancelArgs {
    /// Job id (from `kforge status`).
    job: u64,
}

pub fn cancel(socket: &Path, a: CancelArgs) -> Result<i32> {
    Client::connect(socket)?.request(&Request::Cancel { job: a.job })?;
    println!("job {} cancelled", a.job);
    Ok(0)
}

pub fn shutdown(socket: &Path) -> Result<i32> {
    Client::connect(socket)?.request(&Request::Shutdown)?;
    Ok(0)
}
