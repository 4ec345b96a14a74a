use std::fmt;

/// One invalid field of a request, named as the caller spelled it (`line_items[2].quantity`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field's path in the request.
    pub field: String,
    /// What is wrong with it, in words a caller can act on.
    pub description: String,
}

impl FieldViolation {
    /// A violation of `field`.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self { field: field.into(), description: description.into() }
    }
}

/// A request that failed validation; it lists every invalid field, not just the first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidInput {
    /// At least one violation.
    pub violations: Vec<FieldViolation>,
}

impl InvalidInput {
    /// Turns collected violations into an error, or `Ok` when there are none.
    pub fn check(violations: Vec<FieldViolation>) -> Result<(), Self> {
        if violations.is_empty() { Ok(()) } else { Err(Self { violations }) }
    }
}

impl fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid request: ")?;
        for (i, v) in self.violations.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", v.field, v.description)?;
        }
        Ok(())
    }
}
