//! Tests of the ACP client: recorded and hostile conversations.
use super::*;
