//! Message templates: what a stored template is ([`model`]) and how a task's content is
//! rendered from one when the task is created ([`render`]), so what is stored is exactly what
//! will be sent.

pub mod model;
pub mod render;
pub mod users;

pub use render::Renderer;
