pub fn _x() {}
