use std::fmt;

use super::text::is_visible_ascii;

/// The tenant that owns an order: a positive integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(i64);

impl TenantId {
    /// Accepts only values greater than zero.
    pub fn new(value: i64) -> Result<Self, &'static str> {
        if value > 0 { Ok(Self(value)) } else { Err("must be greater than zero") }
    }

    /// The raw value.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The caller's idempotency key within a tenant: 1 to 128 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    /// The longest request id accepted, in bytes.
    pub const MAX_LEN: usize = 128;

    /// Accepts 1 to [`Self::MAX_LEN`] visible ASCII characters.
    pub fn parse(value: impl Into<String>) -> Result<Self, &'static str> {
        let value = value.into();
        if is_visible_ascii(&value, Self::MAX_LEN) {
            Ok(Self(value))
        } else {
            Err("must be 1 to 128 visible ASCII characters")
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_id_is_positive() {
        assert_eq!(TenantId::new(1).map(TenantId::get), Ok(1));
        assert!(TenantId::new(0).is_err());
        assert!(TenantId::new(-7).is_err());
    }

    #[test]
    fn a_request_id_is_1_to_128_visible_ascii_characters() {
        assert!(RequestId::parse("req-1").is_ok());
        assert!(RequestId::parse("x".repeat(RequestId::MAX_LEN)).is_ok());
        for bad in [
            String::new(),
            "x".repeat(RequestId::MAX_LEN + 1),
            "has space".into(),
            "tab\t".into(),
            "é".into(),
        ] {
            assert!(RequestId::parse(bad.clone()).is_err(), "{bad:?}");
        }
    }
}
