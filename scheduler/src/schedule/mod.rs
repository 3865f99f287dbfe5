//! Recurring schedules and campaigns: fire-time arithmetic ([`fire_times`]), the spreading of
//! a run's recipients over a window ([`spread`]), and the single-leader loop that turns due
//! fire times into tasks ([`materializer`]).

pub mod fire_times;
pub mod materializer;
pub mod spread;
