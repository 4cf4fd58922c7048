//! Robot-like synthetic generator.
