//! Screening one candidate connection: who is it, and does its first frame prove it is ours?

use std::os::fd::BorrowedFd;
use std::time::Duration;

use airlock_protocol::{decode_frame, Frame, LENGTH_PREFIX, TOKEN_LEN};
use bytes::Bytes;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

use crate::error::Refusal;
use crate::raw_sockopt::peer_pidfd;
use crate::PeerExpectation;

/// Checks the peer's credentials, as the kernel recorded them when it connected.
pub(super) fn check_credentials(
    uid: Option<u32>,
    pid: Option<u32>,
    expect: &PeerExpectation,
) -> Result<(), Refusal> {
    let uid = uid.ok_or(Refusal::CredentialsUnavailable(
        std::io::ErrorKind::Unsupported,
    ))?;
    if uid != expect.uid {
        return Err(Refusal::WrongUid {
            expected: expect.uid,
            got: uid,
        });
    }
    if let Some(expected) = expect.pid {
        if pid != Some(expected) {
            return Err(Refusal::WrongPid { expected, got: pid });
        }
    }
    Ok(())
}

/// With the worker's pid expected: checks that the process that made the connection is still
/// the one holding that pid. `SO_PEERCRED` names the pid the connection was made from, frozen
/// at `connect`; a process that connected and exited leaves a connection whose credentials
/// may name the pid the kernel has since given the worker. A pidfd of the connecting process
/// itself (`SO_PEERPIDFD`) tells: it turns readable once that process has exited. A connector
/// that has not exited still holds its pid, and an unreaped child holds the expected one, so
/// a connector that passed the pid check and has not exited is the child itself. No pid
/// numbers are compared here, so the check means the same in any PID namespace.
///
/// Fails closed: only a kernel without the option (before Linux 6.5, `ENOPROTOOPT`) passes
/// unchecked, leaving the `SO_PEERCRED` pid and the token to stand alone.
pub(super) fn check_connector_holds_pid(
    socket: BorrowedFd<'_>,
    expected: u32,
) -> Result<(), Refusal> {
    let pidfd = match peer_pidfd(socket) {
        Ok(pidfd) => pidfd,
        Err(err) if err.raw_os_error() == Some(libc::ENOPROTOOPT) => return Ok(()),
        // Kernels that cannot name a connector that has exited say so with these.
        Err(err) if matches!(err.raw_os_error(), Some(libc::ESRCH | libc::EINVAL)) => {
            return Err(Refusal::ConnectorExited { pid: expected })
        }
        // No descriptor to spare, or anything else: unconfirmed is refused.
        Err(err) => return Err(Refusal::CredentialsUnavailable(err.kind())),
    };
    let mut watch = [PollFd::new(&pidfd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut watch, Some(&zero)) {
        Ok(0) => Ok(()),
        Ok(_) => Err(Refusal::ConnectorExited { pid: expected }),
        Err(err) => Err(Refusal::CredentialsUnavailable(
            std::io::Error::from(err).kind(),
        )),
    }
}

/// Reads the first frame within `timeout` and requires a `Hello` carrying `token`. Returns the
/// stream (positioned just after that frame: exact reads never consume a byte beyond it) and
/// the frame's payload.
pub(super) async fn screen(
    mut stream: UnixStream,
    token: [u8; TOKEN_LEN],
    max_hello: u32,
    timeout: Duration,
) -> Result<(UnixStream, Bytes), Refusal> {
    let payload = tokio::time::timeout(timeout, read_first_frame(&mut stream, max_hello))
        .await
        .map_err(|_| Refusal::HelloTimeout)??;
    check_hello(&payload, &token)?;
    Ok((stream, Bytes::from(payload)))
}

/// One length-prefixed frame, read exactly. The buffer grows with the bytes that arrive, never
/// ahead of them, so a peer claiming a large frame and sending little costs little.
async fn read_first_frame(stream: &mut UnixStream, max: u32) -> Result<Vec<u8>, Refusal> {
    let mut prefix = [0u8; LENGTH_PREFIX];
    stream.read_exact(&mut prefix).await.map_err(read_error)?;
    let len = u32::from_le_bytes(prefix);
    if len == 0 {
        return Err(Refusal::EmptyFrame);
    }
    if len > max {
        return Err(Refusal::FrameTooLarge { len, max });
    }
    let mut payload = Vec::new();
    let read = (&mut *stream)
        .take(u64::from(len))
        .read_to_end(&mut payload)
        .await
        .map_err(read_error)?;
    if read < len as usize {
        return Err(Refusal::ClosedEarly);
    }
    Ok(payload)
}

fn read_error(err: std::io::Error) -> Refusal {
    match err.kind() {
        std::io::ErrorKind::UnexpectedEof => Refusal::ClosedEarly,
        kind => Refusal::Io(kind),
    }
}

/// The first frame must decode as a `Hello` whose token equals ours.
pub(super) fn check_hello(payload: &[u8], token: &[u8; TOKEN_LEN]) -> Result<(), Refusal> {
    let hello = match decode_frame(payload).map_err(|_| Refusal::Malformed)? {
        Frame::Hello(hello) => hello,
        other => return Err(Refusal::NotHello(other.kind())),
    };
    let presented = hello.token.ok_or(Refusal::MissingToken)?;
    if !airlock_protocol::frame::token_matches(presented, token) {
        return Err(Refusal::WrongToken);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use airlock_protocol::frame::{encode_frame, Hello, Shutdown};
    use airlock_protocol::PROTOCOL_VERSION;

    use super::*;

    fn hello(token: Option<&[u8]>) -> Vec<u8> {
        let frame = encode_frame(&Frame::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            worker_name: "w",
            worker_version: "1",
            methods: vec![],
            token,
        }));
        frame[LENGTH_PREFIX..].to_vec()
    }

    #[test]
    fn only_a_hello_with_our_token_passes() {
        let ours = [7u8; TOKEN_LEN];
        assert_eq!(check_hello(&hello(Some(&ours)), &ours), Ok(()));
        let mut other = ours;
        other[TOKEN_LEN - 1] ^= 1;
        assert_eq!(
            check_hello(&hello(Some(&other)), &ours),
            Err(Refusal::WrongToken)
        );
        assert_eq!(
            check_hello(&hello(Some(&ours[..16])), &ours),
            Err(Refusal::WrongToken)
        );
        assert_eq!(check_hello(&hello(None), &ours), Err(Refusal::MissingToken));
        let shutdown = encode_frame(&Frame::Shutdown(Shutdown));
        assert!(matches!(
            check_hello(&shutdown[LENGTH_PREFIX..], &ours),
            Err(Refusal::NotHello(_))
        ));
        assert_eq!(check_hello(&[0xff, 0xff], &ours), Err(Refusal::Malformed));
    }

    #[test]
    fn credentials_must_match() {
        let expect = PeerExpectation { uid: 10, pid: None };
        assert_eq!(check_credentials(Some(10), Some(5), &expect), Ok(()));
        assert_eq!(
            check_credentials(Some(11), Some(5), &expect),
            Err(Refusal::WrongUid {
                expected: 10,
                got: 11
            })
        );
        let expect = PeerExpectation {
            uid: 10,
            pid: Some(5),
        };
        assert_eq!(check_credentials(Some(10), Some(5), &expect), Ok(()));
        assert_eq!(
            check_credentials(Some(10), Some(6), &expect),
            Err(Refusal::WrongPid {
                expected: 5,
                got: Some(6)
            })
        );
        assert_eq!(
            check_credentials(Some(10), None, &expect),
            Err(Refusal::WrongPid {
                expected: 5,
                got: None
            })
        );
        assert!(check_credentials(None, Some(5), &expect).is_err());
    }
}
