//! metadata.yaml
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BagMetadata;
