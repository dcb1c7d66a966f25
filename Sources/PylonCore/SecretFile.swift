#if canImport(Glibc)
import Glibc
#endif

/// A file holding one secret (a bearer token, an enrolment secret, a broker password): the one
/// rule every reader of such a file applies — the backend's `--operator-token-file` and
/// `--enrol-secret-file`, and the plugins' `credentialFile`. It must be a regular file without
/// group or other permission bits (0600 or 0400) and hold `minBytes` to `maxBytes` printable
/// ASCII characters without spaces; trailing whitespace (a newline) is not part of the secret.
public enum SecretFile {
    public static let minBytes = 16
    public static let maxBytes = 4096

    /// Why a secret file cannot be used, naming the file.
    public struct Failure: Error, CustomStringConvertible, Sendable {
        public let description: String
        init(_ d: String) { description = d }
    }

    /// The secret's bytes, or why there is none.
    public static func read(_ path: String) -> Result<[UInt8], Failure> {
        var st = stat()
        guard stat(path, &st) == 0 else { return .failure(Failure("\(path): \(String(cString: strerror(errno)))")) }
        guard (st.st_mode & S_IFMT) == S_IFREG else { return .failure(Failure("\(path) is not a regular file")) }
        guard st.st_mode & 0o077 == 0 else {
            return .failure(Failure("\(path) is readable by group or others (mode must be 0600 or 0400)"))
        }
        guard let raw = System.readFile(path, limit: maxBytes + 2) else { return .failure(Failure("\(path) cannot be read")) }
        var b = raw[...]
        while let l = b.last, l == 0x0A || l == 0x0D || l == 0x20 || l == 0x09 { b = b.dropLast() }
        guard (minBytes...maxBytes).contains(b.count), b.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            return .failure(Failure("\(path) must hold \(minBytes) to \(maxBytes) printable ASCII characters without spaces"))
        }
        return .success(Array(b))
    }
}
