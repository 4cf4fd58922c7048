//! r2r source (feature `ros`); arrives with the ros branch.
