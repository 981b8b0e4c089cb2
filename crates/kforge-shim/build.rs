// Bind the shim's references to its own exports locally: the wrapper
// addresses it hands out (`dlsym`, `cuGetProcAddress`) must be its own
// functions even if another object in the global scope exports the same
// names.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
