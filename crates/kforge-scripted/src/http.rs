//! Just enough HTTP/1.1 for a chat-completions endpoint: a request line, headers and a
//! Content-Length body in; a response with a length, or a chunked stream, out.

use std::io::{self, BufRead, Read, Write};

/// The longest request line or header line accepted.
const MAX_LINE: usize = 16 * 1024;
/// The most header lines accepted.
const MAX_HEADERS: usize = 128;
/// The largest body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One parsed request.
#[derive(Debug)]
pub(crate) struct HttpRequest {
    pub method: String,
    /// The path without its query string.
    pub path: String,
    pub body: Vec<u8>,
    /// The client asked to close the connection after this request (or spoke HTTP/1.0 without
    /// keep-alive).
    pub close: bool,
}

/// What reading the next request gave.
#[derive(Debug)]
pub(crate) enum Incoming {
    Request(HttpRequest),
    /// The client closed the connection between requests.
    Closed,
    /// Not a request this server reads: answer `status` with `message`, then close.
    Bad {
        status: u16,
        message: String,
    },
}

/// Read one request from `reader`; a client that sent `Expect: 100-continue` (curl does, for
/// larger bodies) is told on `out` to send its body.
pub(crate) fn read_request(reader: &mut impl BufRead, out: &mut impl Write) -> io::Result<Incoming> {
    let Some(line) = read_line(reader)? else { return Ok(Incoming::Closed) };
    let line = match line {
        Ok(line) => line,
        Err(message) => return Ok(bad(400, message)),
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Ok(bad(400, format!("malformed request line {line:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Ok(bad(505, format!("unsupported HTTP version {version:?}")));
    }
    let mut close = version == "HTTP/1.0";
    let mut length: Option<usize> = None;
    let mut expect_continue = false;
    for count in 0.. {
        let header = match read_line(reader)? {
            None => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed inside the headers")),
            Some(Err(message)) => return Ok(bad(400, message)),
            Some(Ok(header)) => header,
        };
        if header.is_empty() {
            break;
        }
        if count >= MAX_HEADERS {
            return Ok(bad(431, format!("more than {MAX_HEADERS} header lines")));
        }
        let Some((name, value)) = header.split_once(':') else {
            return Ok(bad(400, format!("malformed header line {header:?}")));
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        match name.as_str() {
            "content-length" => match value.parse::<usize>() {
                Ok(n) if n <= MAX_BODY => length = Some(n),
                Ok(n) => return Ok(bad(413, format!("a body of {n} bytes is over the limit of {MAX_BODY}"))),
                Err(_) => return Ok(bad(400, format!("Content-Length {value:?} is not a number"))),
            },
            "transfer-encoding" => {
                return Ok(bad(
                    411,
                    format!("Transfer-Encoding {value:?} is not supported: send a Content-Length body"),
                ))
            }
            "expect" => expect_continue = value.eq_ignore_ascii_case("100-continue"),
            "connection" => {
                let value = value.to_ascii_lowercase();
                if value.contains("close") {
                    close = true;
                } else if value.contains("keep-alive") {
                    close = false;
                }
            }
            _ => {}
        }
    }
    let mut body = vec![0; length.unwrap_or(0)];
    if expect_continue && !body.is_empty() {
        out.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        out.flush()?;
    }
    reader.read_exact(&mut body)?;
    let path = target.split('?').next().unwrap_or(target).to_owned();
    Ok(Incoming::Request(HttpRequest { method: method.to_owned(), path, body, close }))
}

fn bad(status: u16, message: String) -> Incoming {
    Incoming::Bad { status, message }
}

/// One CRLF- (or LF-) terminated line: `None` at a clean end of input, `Some(Err)` for a line
/// that is too long or not UTF-8.
fn read_line(reader: &mut impl BufRead) -> io::Result<Option<Result<String, String>>> {
    let mut bytes = Vec::new();
    let n = reader.by_ref().take(MAX_LINE as u64 + 1).read_until(b'\n', &mut bytes)?;
    if n == 0 {
        return Ok(None);
    }
    if !bytes.ends_with(b"\n") {
        if bytes.len() > MAX_LINE {
            return Ok(Some(Err(format!("a line longer than {MAX_LINE} bytes"))));
        }
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed inside a line"));
    }
    bytes.pop();
    if bytes.ends_with(b"\r") {
        bytes.pop();
    }
    Ok(Some(String::from_utf8(bytes).map_err(|_| "a request or header line that is not UTF-8".to_owned())))
}

/// The reason phrase of a status this server sends.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Status",
    }
}

/// The head of a response: status line and headers, ending with the blank line.
fn head(status: u16, headers: &[(&str, String)], close: bool) -> String {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(if close { "Connection: close\r\n\r\n" } else { "Connection: keep-alive\r\n\r\n" });
    head
}

/// Write a whole response with a Content-Length.
pub(crate) fn write_response(
    out: &mut impl Write,
    status: u16,
    content_type: &str,
    extra: &[(&str, String)],
    body: &[u8],
    close: bool,
) -> io::Result<()> {
    let mut headers = vec![("Content-Type", content_type.to_owned()), ("Content-Length", body.len().to_string())];
    headers.extend(extra.iter().cloned());
    out.write_all(head(status, &headers, close).as_bytes())?;
    out.write_all(body)?;
    out.flush()
}

/// Start a chunked response (a stream); write its pieces with [`write_chunk`] and end it with
/// [`end_chunks`].
pub(crate) fn start_chunked(out: &mut impl Write, content_type: &str, close: bool) -> io::Result<()> {
    let headers = [
        ("Content-Type", content_type.to_owned()),
        ("Cache-Control", "no-cache".to_owned()),
        ("Transfer-Encoding", "chunked".to_owned()),
    ];
    out.write_all(head(200, &headers, close).as_bytes())?;
    out.flush()
}

/// One chunk of a chunked response, flushed.
pub(crate) fn write_chunk(out: &mut impl Write, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    out.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    out.write_all(data)?;
    out.write_all(b"\r\n")?;
    out.flush()
}

/// The last (empty) chunk.
pub(crate) fn end_chunks(out: &mut impl Write) -> io::Result<()> {
    out.write_all(b"0\r\n\r\n")?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Incoming {
        read_request(&mut io::BufReader::new(text.as_bytes()), &mut Vec::new()).unwrap()
    }

    #[test]
    fn expect_100_continue_is_answered_before_the_body() {
        let mut out = Vec::new();
        let text = "POST /v1/chat/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}";
        let incoming = read_request(&mut io::BufReader::new(text.as_bytes()), &mut out).unwrap();
        assert!(matches!(incoming, Incoming::Request(r) if r.body == b"{}"));
        assert_eq!(out, b"HTTP/1.1 100 Continue\r\n\r\n");
    }

    #[test]
    fn a_request_with_a_body() {
        let Incoming::Request(r) =
            read("POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}")
        else {
            panic!("not a request")
        };
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.body.as_slice(), r.close),
            ("POST", "/v1/chat/completions", &b"{}"[..], false)
        );
    }

    #[test]
    fn connection_close_and_http_1_0() {
        let Incoming::Request(r) = read("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n") else { panic!() };
        assert!(r.close);
        let Incoming::Request(r) = read("GET /health HTTP/1.0\r\n\r\n") else { panic!() };
        assert!(r.close);
        let Incoming::Request(r) = read("GET /health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n") else { panic!() };
        assert!(!r.close);
    }

    #[test]
    fn refusals_name_the_problem() {
        let Incoming::Bad { status, message } = read("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") else {
            panic!()
        };
        assert_eq!(status, 411);
        assert!(message.contains("send a Content-Length body"), "{message}");
        let Incoming::Bad { status, .. } = read("GARBAGE\r\n\r\n") else { panic!() };
        assert_eq!(status, 400);
        let Incoming::Bad { status, .. } = read("GET / HTTP/2\r\n\r\n") else { panic!() };
        assert_eq!(status, 505);
        let Incoming::Bad { message, .. } = read("GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n") else { panic!() };
        assert!(message.contains("not a number"), "{message}");
        assert!(matches!(read(""), Incoming::Closed));
    }
}
