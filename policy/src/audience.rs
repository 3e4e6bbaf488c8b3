//! Audiences: the trust level of the parent session.

use serde::{Deserialize, Serialize};

/// The audience of a parent session, inherited by its subagents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Audience {
    /// A single trusted user.
    Personal,
    /// A trusted team.
    Team,
    /// Untrusted input: gets no subagents at all.
    Public,
}

/// Why an audience may not delegate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AudienceError {
    /// Public sessions run untrusted input and get no subagents.
    #[error("subagents are not available to Public sessions")]
    PublicNotAllowed,
}

impl Audience {
    /// Whether a session of this audience may spawn subagents.
    pub fn check_may_spawn(self) -> Result<(), AudienceError> {
        match self {
            Audience::Personal | Audience::Team => Ok(()),
            Audience::Public => Err(AudienceError::PublicNotAllowed),
        }
    }

    /// The wire name of the audience.
    pub fn as_str(self) -> &'static str {
        match self {
            Audience::Personal => "personal",
            Audience::Team => "team",
            Audience::Public => "public",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_may_not_spawn() {
        assert_eq!(
            Audience::Public.check_may_spawn(),
            Err(AudienceError::PublicNotAllowed)
        );
        assert!(Audience::Personal.check_may_spawn().is_ok());
        assert!(Audience::Team.check_may_spawn().is_ok());
    }

    #[test]
    fn wire_names_round_trip() {
        for a in [Audience::Personal, Audience::Team, Audience::Public] {
            let json = serde_json::to_string(&a).unwrap();
            assert_eq!(json, format!("\"{}\"", a.as_str()));
            let back: Audience = serde_json::from_str(&json).unwrap();
            assert_eq!(back, a);
        }
        assert!(serde_json::from_str::<Audience>("\"admin\"").is_err());
    }
}
