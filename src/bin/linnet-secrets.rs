//! `linnet-secrets`: one network's secrets proxy, confined, which puts the
//! secrets a VM may use into its HTTPS requests (src/secret_proxy/). The
//! daemon starts it; not a command for people.

fn main() -> std::process::ExitCode {
    linnet::secrets_main()
}
