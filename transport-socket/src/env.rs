//! The environment contract between a host and the worker it starts.
//!
//! The host sets these variables on the child; the worker reads them once at start-up.
//! Inherited mode needs at most [`AIRLOCK_SOCKET_FD`]; named mode needs [`AIRLOCK_SOCKET_NAME`]
//! and [`AIRLOCK_TOKEN`].

use std::io;
use std::os::fd::RawFd;

use airlock_protocol::TOKEN_LEN;

/// Inherited mode: the decimal number of the descriptor the worker's end of the socket pair
/// was placed at. Optional: without it the worker uses [`CHILD_SOCKET_FD`].
pub const AIRLOCK_SOCKET_FD: &str = "AIRLOCK_SOCKET_FD";

/// Named mode: the path of the socket the worker connects to. Its presence selects named mode
/// in [`worker_from_env`](crate::worker_from_env).
pub const AIRLOCK_SOCKET_NAME: &str = "AIRLOCK_SOCKET_NAME";

/// Named mode: the connection token, [`TOKEN_LEN`] bytes as 64 lowercase hexadecimal digits.
/// The worker quotes it in its `Hello`; the host refuses any connection that does not.
pub const AIRLOCK_TOKEN: &str = "AIRLOCK_TOKEN";

/// The descriptor number the worker's end of an inherited socket pair takes in the child,
/// unless [`AIRLOCK_SOCKET_FD`] says otherwise: the first one after stdin, stdout and stderr.
pub const CHILD_SOCKET_FD: RawFd = 3;

/// Length of a token written out in hexadecimal.
pub const TOKEN_HEX_LEN: usize = 2 * TOKEN_LEN;

/// The token from [`AIRLOCK_TOKEN`], or `None` if the variable is unset or is not exactly 64
/// lowercase hexadecimal digits.
pub fn token_from_env() -> Option<[u8; TOKEN_LEN]> {
    parse_token(std::env::var(AIRLOCK_TOKEN).ok()?.as_str())
}

/// Parses a token written as 64 lowercase hexadecimal digits; anything else is `None`.
///
/// ```
/// use airlock_transport_socket::parse_token;
/// assert_eq!(parse_token(&"ab".repeat(32)), Some([0xab; 32]));
/// assert_eq!(parse_token(&"AB".repeat(32)), None); // uppercase is not the encoding
/// assert_eq!(parse_token("abcd"), None);
/// ```
pub fn parse_token(hex: &str) -> Option<[u8; TOKEN_LEN]> {
    let digits = hex.as_bytes();
    if digits.len() != TOKEN_HEX_LEN {
        return None;
    }
    let mut token = [0u8; TOKEN_LEN];
    for (byte, pair) in token.iter_mut().zip(digits.chunks_exact(2)) {
        let [high, low] = pair else { return None };
        *byte = (hex_digit(*high)? << 4) | hex_digit(*low)?;
    }
    Some(token)
}

/// Writes a token as 64 lowercase hexadecimal digits, the form [`AIRLOCK_TOKEN`] carries.
pub fn encode_token(token: &[u8; TOKEN_LEN]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(TOKEN_HEX_LEN);
    for byte in token {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

fn hex_digit(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// The descriptor number from [`AIRLOCK_SOCKET_FD`], or [`CHILD_SOCKET_FD`] when it is unset.
pub(crate) fn socket_fd_from_env() -> io::Result<RawFd> {
    match std::env::var(AIRLOCK_SOCKET_FD) {
        Err(std::env::VarError::NotPresent) => Ok(CHILD_SOCKET_FD),
        Err(std::env::VarError::NotUnicode(_)) => Err(invalid(format!(
            "{AIRLOCK_SOCKET_FD} is not a decimal descriptor number"
        ))),
        Ok(text) => parse_fd(&text),
    }
}

/// A descriptor number: decimal digits only, and never one of the standard streams.
fn parse_fd(text: &str) -> io::Result<RawFd> {
    let fd = text
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| text.parse::<RawFd>().ok())
        .flatten()
        .ok_or_else(|| {
            invalid(format!(
                "{AIRLOCK_SOCKET_FD}={text:?} is not a decimal descriptor number"
            ))
        })?;
    if fd < CHILD_SOCKET_FD {
        return Err(invalid(format!(
            "{AIRLOCK_SOCKET_FD}={fd} names a standard stream, never the channel"
        )));
    }
    Ok(fd)
}

pub(crate) fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trips_through_hex() {
        let token: [u8; TOKEN_LEN] = core::array::from_fn(|i| (i * 37) as u8);
        let hex = encode_token(&token);
        assert_eq!(hex.len(), TOKEN_HEX_LEN);
        assert!(hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(parse_token(&hex), Some(token));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let good = "0f".repeat(TOKEN_LEN);
        assert!(parse_token(&good).is_some());
        assert_eq!(parse_token(&good[1..]), None);
        assert_eq!(parse_token(&format!("{good}0")), None);
        assert_eq!(parse_token(&good.replace('f', "F")), None);
        assert_eq!(parse_token(&good.replacen('0', "g", 1)), None);
        assert_eq!(parse_token(&good.replacen("0f", "é", 1)), None);
        assert_eq!(parse_token(""), None);
    }

    #[test]
    fn descriptor_numbers_are_decimal_and_past_stdio() {
        assert_eq!(parse_fd("3").unwrap(), 3);
        assert_eq!(parse_fd("17").unwrap(), 17);
        for bad in ["", "0", "2", "-3", "+3", "0x3", " 3", "3 ", "99999999999"] {
            assert_eq!(
                parse_fd(bad).unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{bad:?}"
            );
        }
    }
}
