/// Number formatting without Foundation.
enum Format {
    /// `v` with `decimals` digits after the point, rounded half away from zero.
    static func fixed(_ v: Double, _ decimals: Int) -> String {
        guard v.isFinite else { return v.isNaN ? "nan" : (v < 0 ? "-inf" : "inf") }
        var scale = 1.0
        for _ in 0..<decimals { scale *= 10 }
        let neg = v < 0
        let n = (abs(v) * scale).rounded()
        guard n < 9e18 else { return String(v) }
        let i = Int64(n)
        let whole = i / Int64(scale)
        var s = (neg && i != 0 ? "-" : "") + String(whole)
        if decimals > 0 {
            var frac = String(i % Int64(scale))
            while frac.count < decimals { frac = "0" + frac }
            s += "." + frac
        }
        return s
    }

    /// Milliseconds as `1.2ms`, `35ms` or `2.41s`.
    static func ms(_ v: Double) -> String {
        if v >= 1000 { return fixed(v / 1000, 2) + "s" }
        return fixed(v, v >= 10 ? 0 : 1) + "ms"
    }

    /// `s` right-aligned in `width` characters.
    static func pad(_ s: String, _ width: Int) -> String {
        s.count >= width ? s : String(repeating: " ", count: width - s.count) + s
    }
}
