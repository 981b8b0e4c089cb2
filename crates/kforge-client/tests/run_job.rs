//! `run_job` against a scripted daemon: a listener that greets, answers the submission with the
//! given replies and records what it was sent.

use kforge_client::{run_job, ClientError};
use kforge_proto::{b64, read_msg, write_msg, JobExit, Policy, Reply, Request, Stream, SubmitSpec};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

fn spec(argv: &[&str]) -> SubmitSpec {
    SubmitSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: "/".into(),
        device: "cpu".into(),
        policy: Some(Policy::Command),
        label: Some("test".into()),
        ..SubmitSpec::default()
    }
}

/// A daemon on `dir`/d.sock that serves one connection: welcome, then after the submission
/// `replies`; returns the requests it read.
fn scripted_daemon(dir: &Path, replies: Vec<Reply>) -> (PathBuf, JoinHandle<Vec<Request>>) {
    let socket = dir.join("d.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let hello: Request = read_msg(&mut conn).unwrap();
        write_msg(&mut conn, &Reply::Welcome { protocol: kforge_proto::PROTOCOL_VERSION, daemon_pid: 1 }).unwrap();
        let submit: Request = read_msg(&mut conn).unwrap();
        for r in &replies {
            write_msg(&mut conn, r).unwrap();
        }
        vec![hello, submit]
    });
    (socket, handle)
}

fn output(stream: Stream, text: &str) -> Reply {
    Reply::Output { job: 7, stream, data: b64::encode(text.as_bytes()) }
}

fn queued() -> Reply {
    Reply::JobQueued { job: 7, device: "cpu".into(), policy: Policy::Command, position: 1, gpu_group: None }
}

#[test]
fn run_job_submits_the_spec_and_streams_each_stream_to_its_writer() {
    let dir = tempfile::tempdir().unwrap();
    let exit = JobExit { code: Some(3), reason: Some("timed out".into()), ..JobExit::default() };
    let (socket, daemon) = scripted_daemon(
        dir.path(),
        vec![
            queued(),
            Reply::JobStarted { job: 7, pid: 42 },
            output(Stream::Stdout, "one "),
            output(Stream::Stderr, "warn\n"),
            output(Stream::Stdout, "two\n"),
            Reply::JobEnded { job: 7, exit: exit.clone() },
        ],
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let ended = run_job(&socket, spec(&["echo", "hi"]), &mut out, &mut err).unwrap();
    assert_eq!(ended, exit);
    assert_eq!(String::from_utf8(out).unwrap(), "one two\n");
    assert_eq!(String::from_utf8(err).unwrap(), "warn\n");
    let requests = daemon.join().unwrap();
    assert!(matches!(&requests[0], Request::Hello { .. }));
    match &requests[1] {
        Request::Submit(s) => assert_eq!(s.argv, ["echo", "hi"]),
        other => panic!("expected a submission, got {other:?}"),
    }
}

#[test]
fn run_job_fails_on_undecodable_output_and_on_a_reply_out_of_place() {
    let dir = tempfile::tempdir().unwrap();
    let bad = Reply::Output { job: 7, stream: Stream::Stdout, data: "not base64!".into() };
    let (socket, daemon) = scripted_daemon(dir.path(), vec![queued(), bad]);
    let e = run_job(&socket, spec(&["x"]), &mut Vec::new(), &mut Vec::new()).unwrap_err();
    assert!(matches!(e, ClientError::UndecodableOutput { job: 7 }), "{e}");
    daemon.join().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let (socket, daemon) = scripted_daemon(dir.path(), vec![Reply::JobStarted { job: 7, pid: 1 }]);
    let e = run_job(&socket, spec(&["x"]), &mut Vec::new(), &mut Vec::new()).unwrap_err();
    assert!(matches!(e, ClientError::Unexpected(_)), "a job must be queued before it starts: {e}");
    daemon.join().unwrap();
}

#[test]
fn a_refused_submission_is_the_daemons_error() {
    let dir = tempfile::tempdir().unwrap();
    let refusal = Reply::Error { code: kforge_proto::ErrorCode::BadRequest, message: "no such device".into() };
    let (socket, daemon) = scripted_daemon(dir.path(), vec![refusal]);
    let e = run_job(&socket, spec(&["x"]), &mut Vec::new(), &mut Vec::new()).unwrap_err();
    assert!(matches!(&e, ClientError::Daemon { message, .. } if message == "no such device"), "{e}");
    daemon.join().unwrap();
}

#[test]
fn a_retried_job_says_so_on_stderr_and_returns_the_second_runs_exit() {
    let dir = tempfile::tempdir().unwrap();
    let second = JobExit { code: Some(0), ..JobExit::default() };
    let (socket, daemon) = scripted_daemon(
        dir.path(),
        vec![
            queued(),
            Reply::JobStarted { job: 7, pid: 42 },
            output(Stream::Stderr, "torch.OutOfMemoryError: CUDA out of memory\n"),
            Reply::JobRetried { job: 7, reason: "CUDA out of memory beside others: run again, alone".into() },
            Reply::JobStarted { job: 7, pid: 43 },
            output(Stream::Stdout, "ok\n"),
            Reply::JobEnded { job: 7, exit: second.clone() },
        ],
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let ended = run_job(&socket, spec(&["x"]), &mut out, &mut err).unwrap();
    assert_eq!(ended, second);
    assert_eq!(String::from_utf8(out).unwrap(), "ok\n");
    let err = String::from_utf8(err).unwrap();
    assert!(err.ends_with("kforge: job 7: CUDA out of memory beside others: run again, alone\n"), "{err}");
    daemon.join().unwrap();
}

/// A job the caller withdraws when it starts (`stream_output_with` answered `false`): no exit,
/// and the connection is closed, which the daemon takes as the job's cancellation.
#[test]
fn a_job_withdrawn_when_it_starts_closes_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("d.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let daemon = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let _hello: Request = read_msg(&mut conn).unwrap();
        write_msg(&mut conn, &Reply::Welcome { protocol: kforge_proto::PROTOCOL_VERSION, daemon_pid: 1 }).unwrap();
        let _submit: Request = read_msg(&mut conn).unwrap();
        write_msg(&mut conn, &queued()).unwrap();
        write_msg(&mut conn, &Reply::JobStarted { job: 7, pid: 42 }).unwrap();
        // What the client does next: nothing but close the connection.
        let next: Result<Request, _> = read_msg(&mut conn);
        next.is_err()
    });
    let job = kforge_client::Client::connect(&socket).unwrap().submit(spec(&["sleep", "60"])).unwrap();
    let (mut out, mut err, mut asked) = (Vec::new(), Vec::new(), 0);
    let exit = job
        .stream_output_with(&mut out, &mut err, &mut || {
            asked += 1;
            false
        })
        .unwrap();
    assert_eq!((exit, asked), (None, 1));
    assert!(daemon.join().unwrap(), "the daemon read the connection's end");
}
