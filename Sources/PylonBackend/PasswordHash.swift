import CCrypto
import PylonCore

/// Operator passwords, hashed with scrypt (OpenSSL's `EVP_PBE_scrypt`: memory-hard, so a stolen
/// database costs an attacker memory as well as time per guess). Stored as
/// `scrypt$N$r$p$<salt base64>$<hash base64>`, the parameters with each hash so they can be
/// raised later without invalidating old ones.
///
/// One hash takes about 100 ms of CPU and `128 * r * N` bytes (32 MiB): the backend computes
/// it on libuv's thread pool (`Loop.runOnThreadPool`), never on the loop, and at most
/// `SessionLimits.maxPasswordJobs` at once. Pure functions of their arguments: safe on any thread.
enum PasswordHash {
    struct Parameters: Equatable, Sendable {
        var n: UInt64 = 1 << 15
        var r: UInt64 = 8
        var p: UInt64 = 1
    }
    static let saltBytes = 16
    static let hashBytes = 32
    /// The largest parameters a stored hash may name (a hostile row must not ask for gigabytes).
    static let maxN: UInt64 = 1 << 20
    static let maxR: UInt64 = 16
    static let maxP: UInt64 = 4

    /// A new hash of `password` with a random salt; nil if OpenSSL failed.
    static func make(_ password: [UInt8], _ params: Parameters = Parameters()) -> String? {
        var salt = [UInt8](repeating: 0, count: saltBytes)
        guard pylon_random(&salt, Int32(saltBytes)) == 1, let h = derive(password, salt: salt, params) else { return nil }
        return "scrypt$\(params.n)$\(params.r)$\(params.p)$\(Base64.encode(salt))$\(Base64.encode(h))"
    }

    /// Whether `password` matches `stored` (constant-time comparison of the derived key).
    static func verify(_ password: [UInt8], _ stored: String) -> Bool {
        let f = stored.split(separator: "$", omittingEmptySubsequences: false)
        guard f.count == 6, f[0] == "scrypt", let n = UInt64(f[1]), let r = UInt64(f[2]), let p = UInt64(f[3]),
            n > 1, n & (n - 1) == 0, n <= maxN, (1...maxR).contains(r), (1...maxP).contains(p),
            let salt = Base64.decode(f[4]), let want = Base64.decode(f[5]), !want.isEmpty,
            let got = derive(password, salt: salt, Parameters(n: n, r: r, p: p), length: want.count)
        else { return false }
        return Credentials.equal(got, want)
    }

    /// A well-formed hash of no password, verified when a name is unknown so that an unknown
    /// name costs the same time as a wrong password.
    static let decoy = make(Array("pylon-decoy-password".utf8)) ?? ""

    private static func derive(_ password: [UInt8], salt: [UInt8], _ pr: Parameters, length: Int = hashBytes) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: length)
        // maxmem: the 128*r*N of the block plus OpenSSL's own buffers.
        let maxmem = 128 * pr.r * pr.n + (1 << 22)
        // An empty password is still a valid pointer (OpenSSL reads none of it).
        let pwBytes = password.isEmpty ? [0] : password
        let rc = pwBytes.withUnsafeBufferPointer { pw in
            salt.withUnsafeBufferPointer { s in
                pw.withMemoryRebound(to: CChar.self) { pwc in
                    EVP_PBE_scrypt(pwc.baseAddress, password.count, s.baseAddress, s.count, pr.n, pr.r, pr.p, maxmem, &out, length)
                }
            }
        }
        return rc == 1 ? out : nil
    }
}

/// RFC 4648 base64 with padding (the stored hash format).
enum Base64 {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode(_ d: [UInt8]) -> String {
        var out: [UInt8] = []
        var i = 0
        while i < d.count {
            let n = min(3, d.count - i)
            let v = (UInt32(d[i]) << 16) | (n > 1 ? UInt32(d[i + 1]) << 8 : 0) | (n > 2 ? UInt32(d[i + 2]) : 0)
            for k in 0..<4 { out.append(k <= n ? alphabet[Int((v >> UInt32(18 - 6 * k)) & 63)] : UInt8(ascii: "=")) }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func decode(_ s: Substring) -> [UInt8]? {
        var vals: [UInt32] = []
        var pad = 0
        for c in s.utf8 {
            if c == UInt8(ascii: "=") { pad += 1; continue }
            guard pad == 0, let i = alphabet.firstIndex(of: c) else { return nil }
            vals.append(UInt32(i))
        }
        guard (vals.count + pad) % 4 == 0, pad <= 2 else { return nil }
        var out: [UInt8] = []
        var i = 0
        while i < vals.count {
            let chunk = vals[i..<min(i + 4, vals.count)]
            var v: UInt32 = 0
            for (k, x) in chunk.enumerated() { v |= x << UInt32(18 - 6 * k) }
            let bytes = chunk.count - 1
            for k in 0..<bytes { out.append(UInt8((v >> UInt32(16 - 8 * k)) & 0xFF)) }
            i += 4
        }
        return out
    }
}
