import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// The signature of `LLVMFuzzerTestOneInput`.
public typealias FuzzEntry = @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt

#if FUZZING
/// libFuzzer's driver (`libclang_rt.fuzzer`, linked by `-sanitize=fuzzer`). SwiftPM links every
/// executable with `main` aliased to the module's `@main`, so libFuzzer's own `main` is not
/// used: our `main` hands the command line to the driver instead.
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    _ entry: FuzzEntry
) -> CInt
#endif

/// A fuzz target's `main`. Built with `-sanitize=fuzzer -DFUZZING` it runs libFuzzer (all of
/// libFuzzer's flags apply). In an ordinary build it is a replay tool: it runs the entry point
/// over the files and directories named on the command line (a corpus, a crash artifact) and
/// exits 0 if nothing trapped.
public enum FuzzMain {
    public static func run(_ entry: FuzzEntry) -> Never {
        #if FUZZING
        var argc = CommandLine.argc
        var argv = CommandLine.unsafeArgv
        exit(LLVMFuzzerRunDriver(&argc, &argv, entry))
        #else
        FuzzReplay.main(entry)
        exit(0)
        #endif
    }
}

public enum FuzzReplay {
    public static func main(_ testOne: FuzzEntry) {
        var files = 0
        for arg in CommandLine.arguments.dropFirst() {
            for path in expand(arg) {
                guard let bytes = readAll(path) else {
                    writeError("cannot read \(path)\n")
                    exit(2)
                }
                _ = bytes.withUnsafeBufferPointer { testOne($0.baseAddress, $0.count) }
                files += 1
            }
        }
        print("replayed \(files) inputs")
    }

    static func expand(_ path: String) -> [String] {
        guard let d = opendir(path) else { return [path] }
        defer { closedir(d) }
        var out: [String] = []
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name.hasPrefix(".") { continue }
            out.append(path + "/" + name)
        }
        return out.sorted()
    }

    static func readAll(_ path: String) -> [UInt8]? {
        guard let f = fopen(path, "rb") else { return nil }
        defer { fclose(f) }
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&buf, 1, buf.count, f)
            if n <= 0 { break }
            out.append(contentsOf: buf[0..<n])
        }
        return out
    }
}

/// A trap with a message: what a fuzz target calls when a property fails (libFuzzer then saves
/// the input as a crash artifact).
public func fuzzCheck(_ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String) {
    if !condition() {
        writeError("fuzz property failed: \(message())\n")
        abort()
    }
}

/// A small deterministic generator seeded from the input, for choices (chunk sizes) that must
/// replay identically.
public struct InputRNG {
    var rng: SplitMix64
    /// Seeded by an FNV-1a hash of the input: the same input always makes the same choices.
    public init(_ bytes: UnsafeRawBufferPointer) {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in bytes { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        rng = SplitMix64(seed: h)
    }
    public mutating func next() -> UInt64 { rng.next() }
}

/// Writes to fd 2 directly (Swift 6 refuses the global `stderr` as shared mutable state).
func writeError(_ s: String) {
    var s = s
    s.withUTF8 { b in _ = write(2, b.baseAddress, b.count) }
}
