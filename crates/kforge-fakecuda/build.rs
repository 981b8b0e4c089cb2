// Bind the fake's references to its own exports locally (like the real
// libcuda): the addresses `cuGetProcAddress` hands out must be the fake's
// own functions even when a preloaded shim exports the same names.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
