//! The store's reads: a run by id, a page of a list, the runs recovery
//! looks at.
