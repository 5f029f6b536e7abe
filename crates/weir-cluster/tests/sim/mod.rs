//! The simulation's parts.

pub mod checks;
pub mod cluster;
pub mod link;
pub mod model;
pub mod object;
