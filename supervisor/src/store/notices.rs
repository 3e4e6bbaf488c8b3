//! Finished-run notices as a column of the run's row: taken once, oldest
//! first.
