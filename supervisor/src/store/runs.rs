//! A run's record as rows: the small `runs` row, the accept-time details
//! and the end's reports, and back.
